// Public surface of the SFT trainer (verl's fsdp_sft_trainer): dataset, loss, driver.
export {
  SFTDataset, buildSftExample, collateSft, pickField, promptMessages, readSftDataConfig, sftPromptIds,
  SFT_TRUNCATIONS, type SftDataConfig, type SftExample, type SftTruncation,
} from "./sft_dataset.js";
export { sftLossSum, countLossTokens } from "./sft_loss.js";
export { loadSftModel, loadSftTokenizer, sftModelView } from "./sft_model.js";
export { SFTTrainer, runSft, type SftResult } from "./sft_trainer.js";
