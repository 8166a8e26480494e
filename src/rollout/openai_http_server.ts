// An OpenAI-compatible HTTP front for a rollout server (token ids in, token ids out), as vLLM's and
// SGLang's servers present a model to verl's generative reward functions: POST /v1/chat/completions
// (messages rendered with the model's chat template), POST /v1/completions (a text or token-id
// prompt) and, for SGLang, its native POST /generate (input_ids or text with sampling_params). It
// listens on 127.0.0.1 only. A malformed request gets a 400 whose message names the field.
//
// Sampling defaults are the served model's (verl's override_generation_config: temperature, top_p,
// top_k, max_new_tokens). A request without a seed gets one derived from its own content, so a run
// is reproducible whatever order concurrent reward functions send their requests in: the same
// request gets the same answer.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ChatMessage, Tokenizer } from "../models/tokenizer.js";
import type { AsyncRolloutServer, GenerationParams, TokenOutput } from "../agent_loop/server.js";

export interface SamplingDefaults {
  temperature: number;
  topP: number;
  topK: number;
  /** Most new tokens when a request names none (verl's max_new_tokens: rollout.response_length). */
  maxTokens: number;
}

export interface OpenAiHttpServerOptions {
  server: AsyncRolloutServer;
  tokenizer: Tokenizer;
  /** The name requests may give as `model` (verl serves the model under its path); others get a 404. */
  modelNames: string[];
  /** Longest prompt + generation. */
  maxModelLen: number;
  defaults: SamplingDefaults;
  /** Mixed into every derived seed. */
  seed: number;
  /** Also serve SGLang's native POST /generate. */
  sglangGenerate: boolean;
  /** Where errors name the server ("reward model server"). */
  label: string;
}

/** A request that cannot be served: its HTTP status and a message naming the field. */
class RequestError extends Error {
  constructor(readonly status: number, message: string, readonly param: string | null = null) {
    super(message);
  }
}

const MAX_BODY_BYTES = 64 * 1024 * 1024;

type Body = Record<string, unknown>;

export class OpenAiHttpServer {
  private requests = 0;
  /** how often each derived seed was handed out (identical requests get successive streams) */
  private readonly repeats = new Map<number, number>();

  private constructor(private readonly http: Server, private readonly opts: OpenAiHttpServerOptions, readonly address: string) {}

  /** Listen on 127.0.0.1 on a free port; `address` is then "127.0.0.1:<port>" (what verl hands reward functions). */
  static async start(opts: OpenAiHttpServerOptions): Promise<OpenAiHttpServer> {
    let self: OpenAiHttpServer | undefined;
    const http = createServer((req, res) => void self!.handle(req, res));
    await new Promise<void>((resolve, reject) => {
      http.once("error", reject);
      http.listen(0, "127.0.0.1", () => resolve());
    });
    const { port } = http.address() as AddressInfo;
    self = new OpenAiHttpServer(http, opts, `127.0.0.1:${port}`);
    return self;
  }

  /** Stop listening and drop open connections. */
  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.http.close(() => resolve());
      this.http.closeAllConnections();
    });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0]!;
    try {
      if (req.method === "GET" && (path === "/health" || path === "/v1/models")) {
        return send(res, 200, path === "/health" ? {} : { object: "list", data: [{ id: this.opts.modelNames[0], object: "model", owned_by: "verl-ts", max_model_len: this.opts.maxModelLen }] });
      }
      // a client that goes away (a scorer past its timeout) cancels its generations, as vLLM aborts them
      const ctx: RequestContext = { requestIds: [] };
      res.on("close", () => {
        if (!res.writableFinished) for (const id of ctx.requestIds) this.opts.server.cancel?.(id);
      });
      const routes: Record<string, (b: Body) => Promise<unknown>> = {
        "/v1/chat/completions": (b) => this.chat(b, ctx),
        "/v1/completions": (b) => this.completions(b, ctx),
        ...(this.opts.sglangGenerate ? { "/generate": (b: Body) => this.generateNative(b, ctx) } : {}),
      };
      const route = routes[path];
      if (!route) throw new RequestError(404, `${this.opts.label}: no route ${req.method} ${path} (it serves POST ${Object.keys(routes).join(", ")}, GET /v1/models, GET /health)`);
      if (req.method !== "POST") throw new RequestError(405, `${this.opts.label}: ${path} takes POST, got ${req.method}`);
      send(res, 200, await route(await readJson(req)));
    } catch (e) {
      const err = e instanceof RequestError ? e : new RequestError(500, `${this.opts.label}: ${(e as Error).message}`);
      const type = err.status === 400 ? "BadRequestError" : err.status === 404 ? "NotFoundError" : err.status === 500 ? "InternalServerError" : "Error";
      send(res, err.status, { error: { message: err.message, type, param: err.param, code: err.status } });
    }
  }

  private checkModel(body: Body): void {
    const m = body.model;
    if (m === undefined || m === null) return;
    if (typeof m !== "string") throw new RequestError(400, "'model' must be a string", "model");
    if (!this.opts.modelNames.includes(m)) throw new RequestError(404, `The model \`${m}\` does not exist: this server serves ${this.opts.modelNames.map((n) => JSON.stringify(n)).join(" (also ")}${this.opts.modelNames.length > 1 ? ")" : ""}`, "model");
  }

  private async chat(body: Body, ctx: RequestContext): Promise<unknown> {
    this.checkModel(body);
    const messages = readMessages(body.messages);
    const tok = this.opts.tokenizer;
    if (!tok.hasChatTemplate) throw new RequestError(400, `${this.opts.label}: the model's tokenizer has no chat template to render 'messages' with (set reward_model.model.custom_chat_template, or POST a prompt to /v1/completions)`);
    const addGenerationPrompt = optBool(body, "add_generation_prompt") ?? true;
    let ids: number[];
    try {
      // the template spells out its special tokens (vLLM's chat endpoint adds none)
      ids = tok.encode(tok.applyChatTemplate(messages, { addGenerationPrompt, kwargs: optRecord(body, "chat_template_kwargs") ?? {} }), { addSpecialTokens: false });
    } catch (e) {
      throw new RequestError(400, `cannot render 'messages' with the chat template: ${(e as Error).message}`, "messages");
    }
    const n = optInt(body, "n", 1) ?? 1;
    const params = this.sampling(body, ids, optInt(body, "max_completion_tokens", 1) ?? optInt(body, "max_tokens", 1));
    const outs = await this.run(ids, params, n, stopStrings(body.stop, "stop"), ctx);
    return {
      id: `chatcmpl-${this.requests}`, object: "chat.completion", created: Math.floor(Date.now() / 1000), model: this.opts.modelNames[0],
      choices: outs.map((o, index) => ({ index, message: { role: "assistant", content: o.text }, logprobs: null, finish_reason: o.finishReason })),
      usage: usage(ids.length, outs),
    };
  }

  private async completions(body: Body, ctx: RequestContext): Promise<unknown> {
    this.checkModel(body);
    const p = body.prompt;
    let ids: number[];
    if (typeof p === "string") ids = this.opts.tokenizer.encode(p, { addSpecialTokens: true });
    else if (Array.isArray(p) && p.length > 0 && p.every((v) => Number.isInteger(v))) ids = p as number[];
    else throw new RequestError(400, "'prompt' must be a string or a non-empty list of token ids (one prompt per request)", "prompt");
    const n = optInt(body, "n", 1) ?? 1;
    // OpenAI's (and vLLM's) default for this endpoint is 16 tokens
    const params = this.sampling(body, ids, optInt(body, "max_tokens", 1) ?? 16);
    const outs = await this.run(ids, params, n, stopStrings(body.stop, "stop"), ctx);
    return {
      id: `cmpl-${this.requests}`, object: "text_completion", created: Math.floor(Date.now() / 1000), model: this.opts.modelNames[0],
      choices: outs.map((o, index) => ({ index, text: o.text, logprobs: null, finish_reason: o.finishReason })),
      usage: usage(ids.length, outs),
    };
  }

  /** SGLang's native endpoint (verl's FAPO recipe posts input_ids and reads output_ids). */
  private async generateNative(body: Body, ctx: RequestContext): Promise<unknown> {
    const sp = optRecord(body, "sampling_params") ?? {};
    let ids: number[];
    if (body.input_ids !== undefined) {
      const v = body.input_ids;
      if (!Array.isArray(v) || v.length === 0 || !v.every((x) => Number.isInteger(x))) throw new RequestError(400, "'input_ids' must be a non-empty list of token ids (one prompt per request)", "input_ids");
      ids = v as number[];
    } else if (typeof body.text === "string") {
      ids = this.opts.tokenizer.encode(body.text, { addSpecialTokens: true });
    } else {
      throw new RequestError(400, "POST /generate needs 'input_ids' (a list of token ids) or 'text' (a string)", "input_ids");
    }
    const params = this.sampling(sp, ids, optInt(sp, "max_new_tokens", 0, "sampling_params.") ?? 128, "sampling_params.");
    const [o] = await this.run(ids, params, 1, stopStrings(sp.stop, "sampling_params.stop"), ctx);
    return {
      text: o!.text, output_ids: o!.tokenIds,
      meta_info: { id: `gen-${this.requests}`, finish_reason: { type: o!.finishReason }, prompt_tokens: ids.length, completion_tokens: o!.tokenIds.length },
    };
  }

  /** The request's sampling parameters over the server's defaults; `maxTokens` null = the default. */
  private sampling(body: Body, promptIds: readonly number[], maxTokens: number | null, where = ""): GenerationParams & { seed: number } {
    const promptLen = promptIds.length;
    const d = this.opts.defaults;
    const temperature = optNum(body, "temperature", where) ?? d.temperature;
    if (temperature < 0) throw new RequestError(400, `'${where}temperature' must be >= 0, got ${temperature}`, `${where}temperature`);
    const topP = optNum(body, "top_p", where) ?? d.topP;
    if (!(topP > 0 && topP <= 1)) throw new RequestError(400, `'${where}top_p' must be in (0, 1], got ${topP}`, `${where}top_p`);
    const topK = optInt(body, "top_k", -1, where) ?? d.topK;
    const room = this.opts.maxModelLen - promptLen;
    if (room <= 0) {
      throw new RequestError(400, `This model's maximum context length is ${this.opts.maxModelLen} tokens; the prompt has ${promptLen} (reward_model.rollout.max_model_len)`, "messages");
    }
    const max = maxTokens ?? Math.min(d.maxTokens, room);
    if (max > room) {
      throw new RequestError(400, `This model's maximum context length is ${this.opts.maxModelLen} tokens. However, you requested ${promptLen + max} tokens (${promptLen} in the prompt, ${max} for the completion)`, `${where}max_tokens`);
    }
    const stopIds = optIntList(body, "stop_token_ids", where);
    const given = optInt(body, "seed", undefined, where);
    this.requests++;
    const params: GenerationParams = { temperature, topP, topK, maxTokens: max, ...(stopIds ? { stopTokenIds: [...this.opts.tokenizer.eosTokenIds, ...stopIds] } : {}) };
    // no seed: one from the request itself (prompt ids and sampling), so arrival order does not matter; the
    // k-th identical request gets the k-th stream (a reward function sampling its judge k times gets k samples)
    let seed = given ?? undefined;
    if (seed === undefined) {
      const base = contentSeed(this.opts.seed, promptIds.join(","), params), k = this.repeats.get(base) ?? 0;
      this.repeats.set(base, k + 1);
      seed = k === 0 ? base : (base ^ Math.imul(k, 0x85ebca6b)) >>> 0;
    }
    return { ...params, seed };
  }

  /** `n` completions of the prompt (choice i > 0 on its own stream), their text cut at a stop string. */
  private async run(ids: number[], params: GenerationParams & { seed: number }, n: number, stops: string[], ctx: RequestContext): Promise<{ text: string; tokenIds: number[]; finishReason: string }[]> {
    const tok = this.opts.tokenizer;
    const outs: TokenOutput[] = await Promise.all(Array.from({ length: n }, (_, i) => this.opts.server.generate(
      pushed(ctx.requestIds, `req-${this.requests}-${i}`), ids, { ...params, seed: i === 0 ? params.seed : (params.seed ^ Math.imul(i, 0x9e3779b1)) >>> 0 },
    ).catch((e: Error) => {
      // the rollout server's own failure (its decoder) is ours; anything else is the request's
      throw new RequestError(e.message.startsWith("rollout server:") ? 500 : 400, e.message);
    })));
    const stopIds = new Set(params.stopTokenIds ?? tok.eosTokenIds);
    return outs.map((o) => {
      const stoppedOnId = o.finishReason === "stop" && o.tokenIds.length > 0 && stopIds.has(o.tokenIds[o.tokenIds.length - 1]!);
      // the stop token ends the text without being part of it
      let text = tok.decode(stoppedOnId ? o.tokenIds.slice(0, -1) : o.tokenIds, { skipSpecialTokens: true });
      let finishReason: string = o.finishReason ?? "length";
      const cut = Math.min(...stops.map((s) => { const at = text.indexOf(s); return at < 0 ? Infinity : at; }));
      if (cut !== Infinity) { text = text.slice(0, cut); finishReason = "stop"; }
      return { text, tokenIds: o.tokenIds, finishReason };
    });
  }
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const data = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(data) });
  res.end(data);
}

async function readJson(req: IncomingMessage): Promise<Body> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > MAX_BODY_BYTES) throw new RequestError(413, `request body larger than ${MAX_BODY_BYTES} bytes`);
    chunks.push(c as Buffer);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch (e) {
    throw new RequestError(400, `the request body is not JSON: ${(e as Error).message}`);
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) throw new RequestError(400, "the request body must be a JSON object");
  return body as Body;
}

function readMessages(v: unknown): ChatMessage[] {
  if (!Array.isArray(v) || v.length === 0) throw new RequestError(400, "'messages' must be a non-empty list of {role, content}", "messages");
  return v.map((m: unknown, i) => {
    if (m === null || typeof m !== "object" || Array.isArray(m)) throw new RequestError(400, `'messages[${i}]' must be an object {role, content}`, "messages");
    const { role, content } = m as Record<string, unknown>;
    if (typeof role !== "string") throw new RequestError(400, `'messages[${i}].role' must be a string`, "messages");
    let text: string;
    if (typeof content === "string") text = content;
    else if (content === null || content === undefined) text = "";
    else if (Array.isArray(content) && content.every((p) => p && typeof p === "object" && (p as Record<string, unknown>).type === "text" && typeof (p as Record<string, unknown>).text === "string")) {
      text = content.map((p) => (p as { text: string }).text).join("");
    } else {
      throw new RequestError(400, `'messages[${i}].content' must be a string or a list of {type: "text", text} parts (this model reads text only)`, "messages");
    }
    return { ...(m as Record<string, unknown>), role, content: text };
  });
}

function optNum(b: Body, k: string, where = ""): number | null {
  const v = b[k];
  if (v === undefined || v === null) return null;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new RequestError(400, `'${where}${k}' must be a number, got ${JSON.stringify(v)}`, `${where}${k}`);
  return v;
}

function optInt(b: Body, k: string, min?: number, where = ""): number | null {
  const v = optNum(b, k, where);
  if (v === null) return null;
  if (!Number.isInteger(v) || (min !== undefined && v < min)) throw new RequestError(400, `'${where}${k}' must be an integer${min !== undefined ? ` >= ${min}` : ""}, got ${v}`, `${where}${k}`);
  return v;
}

function optBool(b: Body, k: string): boolean | null {
  const v = b[k];
  if (v === undefined || v === null) return null;
  if (typeof v !== "boolean") throw new RequestError(400, `'${k}' must be true or false, got ${JSON.stringify(v)}`, k);
  return v;
}

function optRecord(b: Body, k: string): Body | null {
  const v = b[k];
  if (v === undefined || v === null) return null;
  if (typeof v !== "object" || Array.isArray(v)) throw new RequestError(400, `'${k}' must be an object, got ${JSON.stringify(v)}`, k);
  return v as Body;
}

function optIntList(b: Body, k: string, where: string): number[] | null {
  const v = b[k];
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v) || !v.every((x) => Number.isInteger(x) && x >= 0)) throw new RequestError(400, `'${where}${k}' must be a list of token ids`, `${where}${k}`);
  return v as number[];
}

function stopStrings(v: unknown, name: string): string[] {
  if (v === undefined || v === null) return [];
  if (typeof v === "string") return v === "" ? [] : [v];
  if (Array.isArray(v) && v.every((s) => typeof s === "string")) return (v as string[]).filter((s) => s !== "");
  throw new RequestError(400, `'${name}' must be a string or a list of strings`, name);
}

function usage(promptTokens: number, outs: { tokenIds: number[] }[]) {
  const completion = outs.reduce((a, o) => a + o.tokenIds.length, 0);
  return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
}

/** The generations one HTTP request started (cancelled if its client goes away). */
interface RequestContext { requestIds: string[] }

function pushed(ids: string[], id: string): string {
  ids.push(id);
  return id;
}

/** FNV-1a over the base seed, the prompt and the sampling parameters: a 32-bit seed. */
export function contentSeed(base: number, prompt: string, params: GenerationParams): number {
  const s = `${base}|${prompt}|${params.temperature}|${params.topP}|${params.topK}|${params.maxTokens}|${(params.stopTokenIds ?? []).join(",")}`;
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0;
}
