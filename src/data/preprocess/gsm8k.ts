// GSM8K in verl's row layout (examples/data_preprocess/gsm8k.py and, with
// `agent`, gsm8k_tool_agent_loop.py): one user message holding the question and
// an instruction, the final answer after "####" (commas removed) as the rule
// reward's ground truth, and the raw question/answer in extra_info.
import { createProgress } from "../progress.js";
import { findSplitFiles, readRawRecords, requireString, type RawRecord } from "./raw_input.js";
import { writeSplits } from "./output.js";
import { expandHome } from "../home_path.js";
import { snapshotDownload } from "../../utils/hf_hub.js";
import type { PreprocessOptions, PreprocessResult } from "./types.js";

export const GSM8K_DATA_SOURCE = "openai/gsm8k";
export const GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".';
export const GSM8K_AGENT_INSTRUCTION = "Let's think step by step and output the final answer after `####`.";
export const GSM8K_AGENT_SYSTEM_PROMPT =
  "You are a math expert. You are given a question and you need to solve it step by step. " +
  "Reasoning step by step before any tool call. " +
  "You should use the `calc_gsm8k_reward` tool after step by step solving the question, " +
  "before generate final answer at least once and refine your answer if necessary. " +
  "Put your final answer in the format of `#### <answer>`.";

const SOLUTION_RE = /#### (-?[0-9.,]+)/;

/** The first "#### N" in a GSM8K answer, commas removed; undefined when there is none. */
export function extractGsm8kGroundTruth(answer: string): string | undefined {
  const m = SOLUTION_RE.exec(answer);
  return m ? m[1]!.replace(/,/g, "") : undefined;
}

export function gsm8kRow(question: string, answer: string, split: string, index: number, agent = false, where = "row"): Record<string, unknown> {
  const solution = extractGsm8kGroundTruth(answer);
  if (solution === undefined) throw new Error(`${where}: the answer has no final "#### <number>"`);
  if (!agent) {
    return {
      data_source: GSM8K_DATA_SOURCE,
      prompt: [{ role: "user", content: `${question} ${GSM8K_INSTRUCTION}` }],
      ability: "math",
      reward_model: { style: "rule", ground_truth: solution },
      extra_info: { split, index, answer, question },
    };
  }
  const prompt = `${question} ${GSM8K_AGENT_INSTRUCTION}`;
  return {
    data_source: GSM8K_DATA_SOURCE,
    agent_name: "tool_agent",
    prompt: [{ role: "system", content: GSM8K_AGENT_SYSTEM_PROMPT }, { role: "user", content: prompt }],
    ability: "math",
    reward_model: { style: "rule", ground_truth: solution },
    extra_info: {
      split, index, answer, question,
      need_tools_kwargs: true,
      tools_kwargs: { calc_gsm8k_reward: { create_kwargs: { ground_truth: solution } } },
      interaction_kwargs: { query: prompt, ground_truth: solution },
    },
  };
}

function convertSplit(records: RawRecord[], split: string, agent: boolean): Record<string, unknown>[] {
  const progress = createProgress(`gsm8k ${split}`, records.length);
  const rows = records.map((rec, i) => {
    const row = gsm8kRow(requireString(rec, "question"), requireString(rec, "answer"), split, i, agent, rec.where);
    progress.tick();
    return row;
  });
  progress.done();
  return rows;
}

export async function preprocessGsm8k(opts: PreprocessOptions): Promise<PreprocessResult> {
  // As verl's script does: without --local_dataset_path, openai/gsm8k (config "main") from the Hub, through the HF cache.
  const dir = opts.localDatasetPath
    ? expandHome(opts.localDatasetPath)
    : await snapshotDownload("dataset", GSM8K_DATA_SOURCE, { allow: ["main/*.parquet"] });
  const agent = Boolean(opts.agent);
  const splits: Record<string, Record<string, unknown>[]> = {};
  for (const split of ["train", "test"]) {
    splits[split] = convertSplit(await readRawRecords(findSplitFiles(dir, split)), split, agent);
  }
  return writeSplits(opts.localSaveDir ?? "~/data/gsm8k", splits);
}
