// Public surface of the data layer: parquet IO, the RL dataset and its loader, preprocessors.
export { readParquet, readParquetSync, readParquetSchema, writeParquet, rowsToParquetBytes, parquetBytesToRows, type ReadParquetOptions } from "./parquet.js";
export { inferArrowSchema } from "./arrow_schema.js";
export { RLHFDataset, type RLRow, type RLHFDatasetOptions } from "./rl_dataset.js";
export { StatefulDataLoader, type BatchSource, type DataLoaderOptions, type DataLoaderState, type IndexSampler } from "./dataloader.js";
export { collateToDataProto, truncateIds, type CollateOptions } from "./collate.js";
export { readDataConfig, dataFiles, TRUNCATIONS, type RLDataConfig, type Truncation } from "./data_config.js";
export { createRLDataloaders, maxSamples, type RLDataloaders } from "./factory.js";
export { loadCustomDatasetClass, loadSamplerClass, UserDataset, type CustomDatasetClass, type RLDatasetClass, type SamplerClass } from "./custom_dataset.js";
export * from "./preprocess/index.js";
