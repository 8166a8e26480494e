// The `data` section of verl's config, read with types checked: a wrong type is
// an error naming `data.<key>`. Defaults follow verl's RLHFDataset where the
// config leaves a key out.

export type Truncation = "error" | "left" | "right" | "middle";
export const TRUNCATIONS: readonly Truncation[] = ["error", "left", "right", "middle"];

export interface RLDataConfig {
  promptKey: string;
  maxPromptLength: number;
  filterOverlongPrompts: boolean;
  truncation: Truncation;
  applyChatTemplateKwargs: Record<string, unknown>;
  shuffle: boolean;
  /** data.seed; null in the config means 1 (the sampler's seed in verl). */
  seed: number;
  needToolsKwargs: boolean;
}

function get<T>(cfg: Record<string, unknown>, key: string, fallback: T, check: (v: unknown) => boolean, want: string): T {
  const v = cfg[key];
  if (v === undefined || v === null) return fallback;
  if (!check(v)) throw new Error(`data.${key} must be ${want}, got ${JSON.stringify(v)}`);
  return v as T;
}

const isBool = (v: unknown) => typeof v === "boolean";
const isInt = (v: unknown) => Number.isInteger(v);

export function readDataConfig(cfg: Record<string, unknown> = {}): RLDataConfig {
  const maxPromptLength = get(cfg, "max_prompt_length", 1024, (v) => isInt(v) && (v as number) > 0, "a positive integer");
  return {
    promptKey: get(cfg, "prompt_key", "prompt", (v) => typeof v === "string", "a string"),
    maxPromptLength,
    filterOverlongPrompts: get(cfg, "filter_overlong_prompts", true, isBool, "true or false"),
    truncation: get(cfg, "truncation", "error" as Truncation, (v) => TRUNCATIONS.includes(v as Truncation), TRUNCATIONS.join(", ")),
    applyChatTemplateKwargs: get(cfg, "apply_chat_template_kwargs", {}, (v) => typeof v === "object" && !Array.isArray(v), "a mapping"),
    shuffle: get(cfg, "shuffle", true, isBool, "true or false"),
    seed: get(cfg, "seed", 1, isInt, "an integer or null"),
    needToolsKwargs: get(cfg, "need_tools_kwargs", false, isBool, "true or false"),
  };
}

/** data.train_files / data.val_files: one path or a list of paths. */
export function dataFiles(v: unknown, key: string): string[] {
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || list.length === 0 || !list.every((f) => typeof f === "string" && f !== "")) {
    throw new Error(`data.${key} must be a path or a non-empty list of paths, got ${JSON.stringify(v)}`);
  }
  return list as string[];
}
