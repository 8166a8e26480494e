// The same float64 checks on the wasm backend, the one training runs on by default.
import { before, test } from "node:test";
import { initBackend } from "../../../../src/engine/backend.js";
import { Rng } from "../../../../src/utils/rng.js";
import { close } from "../helpers.js";
import { CASE, CONFIG, LOSS_REFERENCES, args, checkAgainst, evaluate } from "./loss_case.js";

before(async () => {
  await initBackend("wasm");
});

test("on wasm every policy loss matches its float64 reference in value and gradient", async () => {
  for (const [name, ref, extra] of LOSS_REFERENCES) await checkAgainst(name, ref, args(CASE, extra));
  const clipCov = await evaluate("clip_cov", args(CASE, { config: { ...CONFIG, policy_loss: { clip_cov_ratio: 0.2, clip_cov_lb: -100, clip_cov_ub: 100 } }, rng: new Rng(5) }));
  close(clipCov.metrics["actor/pg_clipfrac"]!, 2 / 11, 1e-6);
});
