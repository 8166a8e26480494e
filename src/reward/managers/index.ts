// The built-in reward managers, registered under verl's names.
import { BatchRewardManager } from "./batch.js";
import { DapoRewardManager } from "./dapo.js";
import { NaiveRewardManager } from "./naive.js";
import { PrimeRewardManager } from "./prime.js";
import { registerRewardManager } from "./registry.js";

registerRewardManager("naive", NaiveRewardManager);
registerRewardManager("batch", BatchRewardManager);
registerRewardManager("dapo", DapoRewardManager);
registerRewardManager("prime", PrimeRewardManager);

export { BatchRewardManager, DapoRewardManager, NaiveRewardManager, PrimeRewardManager };
export { getRewardManager, knownRewardManagers, registerRewardManager } from "./registry.js";
export { placeScore, readRows, rewardFromRmScores, type RewardRow } from "./common.js";
