// The contract every preprocessor implements (the CLI's `verl preprocess <name>` calls it).

export interface PreprocessOptions {
  /** Folder with the raw data set (gsm8k: train.jsonl/test.jsonl or the Hugging Face parquet files). */
  localDir?: string;
  /** Where train.parquet and test.parquet go. */
  outputDir: string;
  /** gsm8k: the tool-agent variant (agent_name "tool_agent", calc_gsm8k_reward tool kwargs). */
  agent?: boolean;
  numTrain?: number;
  numTest?: number;
  seed?: number;
  digits?: number;
}

export interface PreprocessResult {
  files: string[];
  rows: Record<string, number>;
}

export type Preprocessor = (opts: PreprocessOptions) => Promise<PreprocessResult>;
