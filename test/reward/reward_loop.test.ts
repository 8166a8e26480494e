// reward_model.reward_loop_source=importlib: a user's reward loop class from a TS/JS module, built and
// called as verl's RewardLoopWorker does, contained in scoring threads.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { CharTokenizer } from "../../src/models/tokenizers/char.js";
import { loadRewardManager } from "../../src/reward/load.js";
import { rewardLoopSource } from "../../src/reward/reward_loop.js";
import type { RewardManager } from "../../src/reward/types.js";
import { makeBatch, rewardPositions, rowSums } from "./helpers.js";

const ALPHABET = "0123456789 abcdefghijklmnopqrstuvwxyz"; // the space inside: override values are trimmed
const tok = new CharTokenizer(ALPHABET);
let dir = "";

const LOOP = `
// verl-ts's DataProto, as much of it as this class reads
interface T { data: ArrayLike<number> & { subarray(a: number, b: number): ArrayLike<number> }; shape: number[] }
interface DataProto { length: number; batch: Record<string, T | undefined>; nonTensorBatch: Record<string, unknown[] | undefined> }
type Score = (ds: string, sol: string, gt: unknown, extra: unknown) => unknown;
interface Tok { decode(ids: ArrayLike<number>, o?: { skipSpecialTokens?: boolean }): string }

export class ExactMatchLoop {
  constructor(private config: Record<string, any>, private tokenizer: Tok, private computeScore: Score | null,
              private routerAddress: string | null, private rmTokenizer: unknown) {}

  async run_single(data: DataProto) {
    if (data.length !== 1) throw new Error("one row at a time");
    const P = data.batch.prompts!.shape[1]!, mask = data.batch.attention_mask!.data, T = data.batch.attention_mask!.shape[1]!;
    let len = 0;
    for (let t = P; t < T; t++) len += Number(mask[t]);
    const text = this.tokenizer.decode(data.batch.responses!.data.subarray(0, len), { skipSpecialTokens: true });
    const gt = (data.nonTensorBatch.reward_model![0] as { ground_truth: string }).ground_truth;
    const ds = String(data.nonTensorBatch.data_source![0]);
    if (text === "boom") throw new Error("cannot score boom");
    if (text === "hang") await new Promise(() => undefined);
    const extra = this.computeScore ? Number(await this.computeScore(ds, text, gt, null)) : 0;
    return {
      reward_score: (text === gt ? 1 : 0) + extra,
      reward_extra_info: { chars: text.length, router: this.routerAddress, rm_tokenizer: this.rmTokenizer === null ? null : typeof (this.rmTokenizer as { encode?: unknown }).encode, lr: this.config.actor_rollout_ref.actor.optim.lr },
    };
  }
}

export class NoRunSingle {}
export const notAClass = 3;
`;

before(() => {
  dir = mkdtempSync(join(tmpdir(), "verl-reward-loop-"));
  writeFileSync(join(dir, "loop.ts"), LOOP);
  writeFileSync(join(dir, "bonus.mjs"), "export function compute_score(ds, sol, gt) { return sol.length > 3 ? 0.5 : 0; }\n");
});
after(() => rmSync(dir, { recursive: true, force: true }));

const config = (extra: string[] = [], cls = "ExactMatchLoop") => loadConfig({
  configName: "ppo_trainer",
  overrides: [
    "actor_rollout_ref.model.path=scratch", `actor_rollout_ref.model.tokenizer_path=char:${ALPHABET}`, "actor_rollout_ref.actor.optim.lr=0.25",
    "reward_model.reward_loop_source=importlib", `reward_model.reward_loop_module_path=${join(dir, "loop.ts")}`, `reward_model.reward_loop_class_name=${cls}`,
    "+reward_model.reward_kwargs.num_workers=1", ...extra,
  ],
});

async function withManager<T>(cfg: ReturnType<typeof config>, fn: (m: RewardManager) => Promise<T>): Promise<T> {
  const mgr = await loadRewardManager(cfg, tok, { numExamine: 0 });
  try {
    return await fn(mgr);
  } finally {
    await mgr.close?.();
  }
}

const rows = [
  { prompt: "q", response: "42", dataSource: "my/task", groundTruth: "42" },
  { prompt: "q", response: "forty two", dataSource: "my/task", groundTruth: "42" },
  { prompt: "q", response: "", dataSource: "other", groundTruth: "" },
];

test("the class is built with (config, tokenizer, compute_score, router, rm tokenizer) and run_single scores each row at its last response token", async () => {
  await withManager(config(), async (mgr) => {
    const { rewardTensor, rewardExtraInfo } = await mgr.compute(makeBatch(tok, rows, 2, 10));
    assert.deepEqual(rowSums(rewardTensor), [1, 0, 1]);
    // an empty response's score goes to the last slot, as verl's valid_len - 1 indexes it
    assert.deepEqual(rewardPositions(rewardTensor), [1, -1, 9]);
    assert.deepEqual(rewardExtraInfo, { chars: [2, 9, 0], router: [null, null, null], rm_tokenizer: [null, null, null], lr: [0.25, 0.25, 0.25] });
  });
  // custom_reward_function.path reaches the class as its compute_score
  await withManager(config([`custom_reward_function.path=${join(dir, "bonus.mjs")}`]), async (mgr) => {
    assert.deepEqual(rowSums((await mgr.compute(makeBatch(tok, rows, 2, 10))).rewardTensor), [1, 0.5, 1]);
  });
});

test("with a generative reward model served, the class gets the server's address and the reward model's tokenizer (verl's 4th and 5th arguments)", async () => {
  const cfg = config(["reward_model.model.path=scratch", `+reward_model.model.tokenizer_path=char:${ALPHABET}`]);
  const mgr = await loadRewardManager(cfg, tok, { numExamine: 0, servedRewardModel: { routerAddress: "127.0.0.1:9", config: cfg } });
  try {
    const { rewardExtraInfo } = await mgr.compute(makeBatch(tok, rows.slice(0, 2), 2, 10));
    assert.deepEqual(rewardExtraInfo.router, ["127.0.0.1:9", "127.0.0.1:9"]);
    assert.deepEqual(rewardExtraInfo.rm_tokenizer, ["function", "function"]);
  } finally {
    await mgr.close?.();
  }
});

test("user code is contained: a throw or a hang fails the step naming the class, its file and the row", async () => {
  const bad = [rows[0]!, { prompt: "q", response: "boom", dataSource: "my/task", groundTruth: "x" }];
  await withManager(config(), async (mgr) => {
    await assert.rejects(mgr.compute(makeBatch(tok, bad, 2, 10)), (e: Error) =>
      /reward loop ExactMatchLoop \(.*loop\.ts\) failed on row 1 \(data_source "my\/task"\): cannot score boom/.test(e.message));
  });
  const hung = [{ prompt: "q", response: "hang", dataSource: "my/task", groundTruth: "x" }];
  await withManager(config(["+reward_model.reward_kwargs.timeout_s=1"]), async (mgr) => {
    await assert.rejects(mgr.compute(makeBatch(tok, hung, 2, 10)), /reward loop ExactMatchLoop .* failed on row 0 .*timed out after 1 s \(reward_model\.reward_kwargs\.timeout_s\)/);
  });
  await withManager(config([], "NoRunSingle"), async (mgr) => {
    await assert.rejects(mgr.compute(makeBatch(tok, rows, 2, 10)), /reward loop NoRunSingle .*has no run_single\(data\) method/);
  });
  await withManager(config([], "notAClass"), async (mgr) => {
    await assert.rejects(mgr.compute(makeBatch(tok, rows, 2, 10)), /reward loop notAClass .*the export is a number, not a class/);
  });
});

test("reward_loop_* settings: missing keys, a Python module and an unknown source are errors naming the key; register and use_reward_loop=false leave the manager", () => {
  const cfg = (o: string[]) => loadConfig({ configName: "ppo_trainer", overrides: o });
  assert.equal(rewardLoopSource(cfg([])), null);
  assert.throws(() => rewardLoopSource(cfg(["reward_model.reward_loop_source=importlib", "reward_model.reward_loop_class_name=X"])), /reward_loop_source=importlib needs reward_model\.reward_loop_module_path/);
  assert.throws(() => rewardLoopSource(cfg(["reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=a.ts"])), /needs reward_model\.reward_loop_class_name/);
  assert.throws(() => rewardLoopSource(cfg(["reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=my/loop.py", "reward_model.reward_loop_class_name=X"])),
    /reward_loop_module_path=my\/loop\.py is Python: .*needs verl, torch and transformers/);
  assert.throws(() => rewardLoopSource(cfg(["reward_model.reward_loop_source=pkg"])), /reward_model\.reward_loop_source must be "register" or "importlib", got "pkg"/);
  assert.equal(rewardLoopSource(cfg(["reward_model.reward_loop_source=importlib", "reward_model.reward_loop_module_path=a.ts", "reward_model.reward_loop_class_name=X", "reward_model.use_reward_loop=false"])), null);
});
