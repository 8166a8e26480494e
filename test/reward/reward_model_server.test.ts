// A generative reward model served for the run (reward_model.enable, reward_model.rollout.name=vllm|sglang,
// custom_reward_function.path): stories260K behind an OpenAI-compatible endpoint on 127.0.0.1, queried by a
// JS reward function that gets the address and the reward model's tokenizer, as verl's reward loop hands them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { loadConfig } from "../../src/config/index.js";
import { initBackend } from "../../src/engine/backend.js";
import { loadLlama2c } from "../../src/models/llama2c.js";
import { loadTokenizer } from "../../src/models/tokenizers/index.js";
import { RewardModelServer } from "../../src/reward/reward_model_server.js";
import { defaultSamplingParams, generate, leftPadPrompts } from "../../src/rollout/index.js";
import { readParamsForDecode } from "../../src/rollout/decode_weights.js";
import { runPpo } from "../../src/trainer/main_ppo.js";
import { Rng } from "../../src/utils/rng.js";
import { STORIES_MISSING, storiesBin, tok512Bin } from "../models/stories.js";
import { makeWorkspace, metricsByStep, runTrain } from "../trainer/ppo/trainer/fixtures.js";

// (no bos_token: the llama2.c tokenizer reads "<s>" in text as three characters)
const TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}";

/** The overrides that serve stories260K as the generative reward model. */
const genrm = (bin: string, engine = "vllm") => [
  "reward_model.enable=true", `reward_model.model.path=${bin}`, `reward_model.rollout.name=${engine}`,
  `+reward_model.model.custom_chat_template="${TEMPLATE}"`,
];

const post = async (address: string, path: string, body: unknown) => {
  const res = await fetch(`http://${address}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Record<string, any> };
};

/** Whether something still listens at host:port. */
const listening = (address: string) => new Promise<boolean>((resolve) => {
  const [host, port] = address.split(":");
  const s = connect(Number(port), host!);
  s.once("connect", () => { s.destroy(); resolve(true); });
  s.once("error", () => resolve(false));
});

test("the reward model server: chat completions are the model's greedy decode of the templated messages; bad requests get a 400 naming the field", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("cpu");
  const config = loadConfig({ configName: "ppo_trainer", overrides: [...genrm(bin), "custom_reward_function.path=unused.mjs", "reward_model.rollout.max_model_len=64"] });
  const server = (await RewardModelServer.startIfConfigured(config))!;
  assert.ok(server, "a generative reward model is served");
  const address = server.ref.routerAddress;
  try {
    assert.match(address, /^127\.0\.0\.1:\d+$/);
    assert.equal(await listening(address), true);
    const messages = [{ role: "user", content: "Once upon a time" }];
    const greedy = await post(address, "/v1/chat/completions", { model: bin, messages, temperature: 0, max_tokens: 12 });
    assert.equal(greedy.status, 200, JSON.stringify(greedy.json));
    const choice = greedy.json.choices[0];
    assert.equal(choice.message.role, "assistant");
    // the reference: the same ids (the template's rendering, no special tokens added) decoded greedily by the rollout's generate
    const tok = await loadTokenizer(tok512Bin()!.replace(/\/tok512\.bin$/, ""));
    const ids = tok.encode("Once upon a time", { addSpecialTokens: false });
    const model = loadLlama2c(bin);
    try {
      await readParamsForDecode(model);
      const ref = generate(model, leftPadPrompts([ids], 0), defaultSamplingParams({ temperature: 0, responseLength: 12, eosTokenIds: tok.eosTokenIds, padTokenId: 0 }), new Rng(0));
      const refIds = Array.from(ref.batch["responses"]!.data).filter((_, i) => ref.batch["response_mask"] ? ref.batch["response_mask"].data[i] === 1 : true);
      assert.equal(choice.message.content, tok.decode(refIds.filter((id) => !tok.eosTokenIds.includes(id)), { skipSpecialTokens: true }));
      assert.deepEqual(greedy.json.usage, { prompt_tokens: ids.length, completion_tokens: refIds.length, total_tokens: ids.length + refIds.length });
    } finally {
      model.dispose();
    }
    assert.ok(choice.message.content.length > 0);
    // sampled without a seed: the seed comes from the request's ids and sampling, and the k-th identical
    // request gets the k-th stream, so a reward function asking its judge twice gets two samples (as from vLLM)
    const sampled = { messages, temperature: 1, max_tokens: 12 };
    const [a, b] = await Promise.all([post(address, "/v1/chat/completions", sampled), post(address, "/v1/chat/completions", sampled)]);
    assert.notEqual(a.json.choices[0].message.content, b.json.choices[0].message.content);
    const seeded = await Promise.all([1, 2, 3].map((seed) => post(address, "/v1/chat/completions", { ...sampled, seed })));
    assert.ok(new Set(seeded.map((r) => r.json.choices[0].message.content)).size > 1, "different seeds sample differently");
    // /v1/completions with the same ids matches the chat rendering
    const comp = await post(address, "/v1/completions", { prompt: ids, temperature: 0, max_tokens: 12 });
    assert.equal(comp.status, 200);
    assert.equal(comp.json.choices[0].text, choice.message.content);

    const bad = async (path: string, body: unknown, status: number, message: RegExp) => {
      const r = await post(address, path, body);
      assert.equal(r.status, status, JSON.stringify(r.json));
      assert.match(r.json.error.message, message);
      assert.equal(r.json.error.code, status);
    };
    await bad("/v1/chat/completions", "{not json", 400, /the request body is not JSON/);
    await bad("/v1/chat/completions", { prompt: "hi" }, 400, /'messages' must be a non-empty list of \{role, content\}/);
    await bad("/v1/chat/completions", { messages: [{ content: "hi" }] }, 400, /'messages\[0\]\.role' must be a string/);
    await bad("/v1/chat/completions", { messages, temperature: "hot" }, 400, /'temperature' must be a number, got "hot"/);
    await bad("/v1/chat/completions", { messages, max_tokens: 100 }, 400, /maximum context length is 64 tokens\. However, you requested/);
    await bad("/v1/chat/completions", { messages, model: "gpt-4o" }, 404, /The model `gpt-4o` does not exist/);
    await bad("/v1/completions", { prompt: [1, 99999] }, 400, /token id 99999 outside the vocabulary/);
    // SGLang's native /generate is served only for rollout.name=sglang
    await bad("/generate", { input_ids: ids }, 404, /no route POST \/generate/);
  } finally {
    await server.close();
  }
  assert.equal(await listening(address), false, "closed: nothing listens at the address any more");
});

test("rollout.name=sglang also serves SGLang's native /generate (input_ids in, output_ids out), as verl's FAPO recipe calls it", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  await initBackend("cpu");
  const config = loadConfig({ configName: "ppo_trainer", overrides: [...genrm(bin, "sglang"), "custom_reward_function.path=unused.mjs"] });
  const server = (await RewardModelServer.startIfConfigured(config))!;
  try {
    const ids = [1, 403, 407, 261, 378];
    const native = await post(server.ref.routerAddress, "/generate", { input_ids: ids, sampling_params: { temperature: 0, max_new_tokens: 8 } });
    assert.equal(native.status, 200, JSON.stringify(native.json));
    const comp = await post(server.ref.routerAddress, "/v1/completions", { prompt: ids, temperature: 0, max_tokens: 8 });
    assert.equal(native.json.text, comp.json.choices[0].text);
    assert.equal(native.json.output_ids.length, native.json.meta_info.completion_tokens);
    assert.ok(native.json.output_ids.length > 0 && native.json.output_ids.length <= 8);
    const bad = await post(server.ref.routerAddress, "/generate", { sampling_params: {} });
    assert.equal(bad.status, 400);
    assert.match(bad.json.error.message, /needs 'input_ids' .* or 'text'/);
  } finally {
    await server.close();
  }
});

/** A GenRM reward function: asks the served model to continue the response and scores the share of 'e' in its reply. */
const REWARD_FN = (log: string, fail: boolean) => `
import { appendFileSync } from "node:fs";
export async function compute_score(dataSource, solution, groundTruth, extraInfo, kwargs) {
  const { reward_router_address: address, reward_model_tokenizer: tok } = kwargs;
  const res = await fetch("http://" + address + "/v1/chat/completions", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content: solution }], temperature: 0.7, max_tokens: 8 }),
  });
  if (res.status !== 200) throw new Error("reward model answered " + res.status + ": " + await res.text());
  const reply = (await res.json()).choices[0].message.content;
  appendFileSync(${JSON.stringify(log)}, JSON.stringify({ address, reply, tokens: tok.encode(reply, { addSpecialTokens: false }).length }) + "\\n");
  if (${fail}) throw new Error("the judge refused to score");
  const letters = reply.replace(/[^a-z]/gi, "");
  return { score: letters.length === 0 ? 0 : (letters.split("e").length - 1) / letters.length, genrm_tokens: tok.encode(reply, { addSpecialTokens: false }).length };
}
`;

const readLog = (path: string) => readFileSync(path, "utf8").trim().split("\n").map((l) => JSON.parse(l) as { address: string; reply: string; tokens: number });

test("verl train, GRPO 2 steps, stories260K actor scored by a stories260K GenRM through its served endpoint", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const ws = await makeWorkspace();
  try {
    const log = join(ws.dir, "genrm.jsonl"), fn = join(ws.dir, "genrm.mjs"), metricsFile = join(ws.dir, "metrics.jsonl");
    writeFileSync(fn, REWARD_FN(log, false));
    const run = await runTrain([
      ...ws.overrides, `actor_rollout_ref.model.path=${bin}`, "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2",
      "trainer.test_freq=-1", "trainer.n_gpus_per_node=1", `custom_reward_function.path=${fn}`, ...genrm(bin),
    ], { VERL_FILE_LOGGER_PATH: metricsFile });
    assert.equal(run.code, 0, run.stderr.slice(-3000));
    const calls = readLog(log);
    // 4 prompts x 2 samples per step, every one scored through the server
    assert.equal(calls.length, 16);
    assert.equal(new Set(calls.map((c) => c.address)).size, 1);
    assert.match(calls[0]!.address, /^127\.0\.0\.1:\d+$/);
    assert.ok(calls.some((c) => c.reply.length > 0 && c.tokens > 0), "the reward model replied, and its tokenizer read the reply");
    const metrics = metricsByStep(readFileSync(metricsFile, "utf8"));
    assert.deepEqual([...metrics.keys()].sort(), [1, 2]);
    for (const [step, m] of metrics) {
      assert.ok(Number.isFinite(m["critic/score/mean"]) && m["critic/score/max"]! > 0, `step ${step}: the GenRM's scores reach the advantages (critic/score/max ${m["critic/score/max"]})`);
    }
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});

test("a failing GenRM reward function fails the run naming the function and the sample, and the server is closed after it", async (t) => {
  const bin = storiesBin();
  if (!bin) return t.skip(STORIES_MISSING);
  const ws = await makeWorkspace();
  try {
    const log = join(ws.dir, "genrm.jsonl"), fn = join(ws.dir, "genrm_fail.mjs");
    writeFileSync(fn, REWARD_FN(log, true));
    const config = loadConfig({
      configName: "ppo_trainer",
      overrides: [...ws.overrides, `actor_rollout_ref.model.path=${bin}`, "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1",
        "trainer.test_freq=-1", "trainer.n_gpus_per_node=1", "trainer.logger=[]", `custom_reward_function.path=${fn}`, ...genrm(bin)],
    });
    await assert.rejects(runPpo(config), /reward function compute_score \(.*genrm_fail\.mjs\) failed on sample \d+ .*the judge refused to score/);
    assert.ok(existsSync(log), "the function reached the server before it threw");
    const address = readLog(log)[0]!.address;
    assert.equal(await listening(address), false, `the reward model server at ${address} is closed once the run ends`);
  } finally {
    rmSync(ws.dir, { recursive: true, force: true });
  }
});
