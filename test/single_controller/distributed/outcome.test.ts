// A run fails and restarts as one unit: the driver sends the run's outcome with its
// shutdown, and an agent exits 0 only when the run succeeded.
import { test } from "node:test";
import assert from "node:assert/strict";
import { launchCluster } from "./cluster_helpers.js";

test("agents exit 1 when the driver stops a run that did not succeed, naming why", { timeout: 60_000 }, async () => {
  const cluster = await launchCluster([{ name: "hostA" }, { name: "hostB" }], 1);
  // The driver ends without markRunSucceeded (an error in the trainer, say).
  await cluster.pool.destroy(5000);
  for (const a of cluster.agents) {
    assert.equal(await a.exited, 1, a.output.join(""));
    assert.match(a.output.join(""), /the driver stopped the run: the driver stopped before the run succeeded/);
  }
});

test("agents exit 0 when the run succeeded", { timeout: 60_000 }, async () => {
  const cluster = await launchCluster([{ name: "hostA" }, { name: "hostB" }], 1);
  cluster.pool.markRunSucceeded();
  await cluster.pool.destroy(5000);
  for (const a of cluster.agents) assert.equal(await a.exited, 0, a.output.join(""));
});
