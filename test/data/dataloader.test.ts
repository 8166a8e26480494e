import { test } from "node:test";
import assert from "node:assert/strict";
import { StatefulDataLoader, type DataLoaderState } from "../../src/data/dataloader.js";
import type { DataProto } from "../../src/protocol/index.js";

const source = (n: number) => ({ length: n, get: (i: number) => ({ id: i, tag: `r${i}` }) });
const ids = (b: DataProto) => b.nonTensorBatch.id as number[];
const take = (it: Iterator<DataProto>, k: number) => Array.from({ length: k }, () => ids(it.next().value as DataProto));

test("same seed, same order; each epoch is a fresh permutation of every row", () => {
  const a = new StatefulDataLoader(source(10), { batchSize: 5, seed: 7 });
  const b = new StatefulDataLoader(source(10), { batchSize: 5, seed: 7 });
  const e0 = [...a].flatMap(ids), e0b = [...b].flatMap(ids);
  assert.deepEqual(e0, e0b);
  assert.deepEqual([...e0].sort((x, y) => x - y), [...Array(10).keys()]);
  assert.notDeepEqual(e0, [...Array(10).keys()], "shuffled");
  const e1 = [...a].flatMap(ids);
  assert.notDeepEqual(e1, e0, "the next epoch has another order");
  assert.equal(a.currentEpoch, 2);
  assert.notDeepEqual([...new StatefulDataLoader(source(10), { batchSize: 10, seed: 8 })].flatMap(ids), e0);
  assert.deepEqual([...new StatefulDataLoader(source(5), { batchSize: 2, shuffle: false })].map(ids), [[0, 1], [2, 3], [4]]);
});

test("drop_last drops the short batch; length counts batches", () => {
  const l = new StatefulDataLoader(source(7), { batchSize: 3, dropLast: true, seed: 1 });
  assert.equal(l.length, 2);
  const got = [...l].map(ids);
  assert.deepEqual(got.map((g) => g.length), [3, 3]);
  assert.equal(new StatefulDataLoader(source(7), { batchSize: 3 }).length, 3);
  assert.equal(new StatefulDataLoader(source(2), { batchSize: 3, dropLast: true }).length, 0);
  assert.deepEqual([...new StatefulDataLoader(source(2), { batchSize: 3, dropLast: true })], []);
  assert.throws(() => new StatefulDataLoader(source(2), { batchSize: 0 }), /batch size must be a positive integer/);
});

test("resume mid-epoch picks up at the same sample, across a JSON round trip", () => {
  const ref = new StatefulDataLoader(source(11), { batchSize: 3, seed: 3, dropLast: true });
  const full = [...[...ref].map(ids), ...[...ref].map(ids)]; // two epochs, 3 batches each

  const a = new StatefulDataLoader(source(11), { batchSize: 3, seed: 3, dropLast: true });
  const it = a[Symbol.iterator]();
  assert.deepEqual(take(it, 2), full.slice(0, 2));
  const saved = JSON.parse(JSON.stringify(a.stateDict())) as DataLoaderState;
  assert.deepEqual(saved, { epoch: 0, position: 6, seed: 3, shuffle: true, datasetLength: 11 });

  const b = new StatefulDataLoader(source(11), { batchSize: 3, seed: 3, dropLast: true });
  b.loadStateDict(saved);
  const rest = [...[...b].map(ids), ...[...b].map(ids)];
  assert.deepEqual(rest, full.slice(2, 6 + 3), "the rest of epoch 0 and then epoch 1");
});

test("a state saved after an epoch's last batch resumes with the next epoch", () => {
  const ref = new StatefulDataLoader(source(6), { batchSize: 3, seed: 9 });
  [...ref];
  const epoch1 = [...ref].map(ids);
  const a = new StatefulDataLoader(source(6), { batchSize: 3, seed: 9 });
  const it = a[Symbol.iterator]();
  take(it, 2); // the trainer saves inside the loop body, before the loop sees the end
  const b = new StatefulDataLoader(source(6), { batchSize: 3, seed: 9 });
  b.loadStateDict(a.stateDict());
  assert.deepEqual([...b].map(ids), epoch1);
  assert.equal(b.currentEpoch, 2);
});

test("breaking out of the loop keeps the position", () => {
  const a = new StatefulDataLoader(source(9), { batchSize: 3, seed: 2 });
  const order = a.order(0);
  for (const _ of a) break;
  assert.deepEqual(a.stateDict().position, 3);
  assert.deepEqual([...a].flatMap(ids), order.slice(3));
});

test("loadStateDict rejects states that would resume at the wrong sample", () => {
  const l = new StatefulDataLoader(source(6), { batchSize: 3, seed: 9 });
  const good = l.stateDict();
  assert.throws(() => l.loadStateDict({ ...good, datasetLength: 7 }), /saved for a dataset of 7 rows, but this dataset has 6/);
  assert.throws(() => l.loadStateDict({ ...good, seed: 1 }), /saved with seed=1 shuffle=true, but this loader has seed=9/);
  assert.throws(() => l.loadStateDict({ ...good, position: -1 }), /'position' must be a non-negative integer/);
  assert.throws(() => l.loadStateDict({ ...good, position: 9 }), /position 9 is past/);
});
