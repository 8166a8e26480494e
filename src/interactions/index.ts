// Public surface of the interactions layer (simulated users for multi-turn rollouts).
export { BaseInteraction, type InteractionClass, type InteractionTurn } from "./base.js";
export { Gsm8kInteraction, GSM8K_CORRECT, GSM8K_INCORRECT } from "./gsm8k_interaction.js";
export { loadInteractionsFromConfig, registerInteractionClass, interactionClassNames } from "./registry.js";
