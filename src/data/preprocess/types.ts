// The contract every preprocessor implements (the CLI's `verl preprocess <name>` calls it).

export interface PreprocessOptions {
  /** verl's --local_dataset_path: the raw data set (gsm8k: a folder with train.jsonl/test.jsonl or the Hugging Face parquet files). */
  localDatasetPath?: string;
  /** verl's --local_save_dir: where train.parquet and test.parquet go (each preprocessor has its default, e.g. ~/data/gsm8k). */
  localSaveDir?: string;
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
