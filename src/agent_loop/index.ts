// Public surface of the agent-loop layer: multi-turn, tool-using rollouts.
export { AgentLoopManager, AGENT_LOOP_ROW_KEYS, needsAgentLoop, type AgentLoopManagerOptions, type GenerateOptions as AgentLoopGenerateOptions } from "./manager.js";
export { AgentLoopBase, type AgentLoopClass, type AgentLoopContext } from "./base.js";
export { registerAgentLoop, getAgentLoopClass, agentLoopNames, loadAgentLoopConfig, type AgentLoopSpec } from "./registry.js";
export { SingleTurnAgentLoop } from "./single_turn.js";
export { ToolAgentLoop, AgentState } from "./tool_agent.js";
export { AgentData } from "./agent_data.js";
export { emptyMetrics, type AgentLoopMetrics, type AgentLoopOutput, type AgentLoopRow } from "./types.js";
export { checkGenerationParams, seededForTurn, RequestAbortedError, type AsyncRolloutServer, type GenerationParams, type TokenOutput } from "./server.js";
export { ContinuousBatchingServer, type ContinuousBatchingServerOptions, type BatchingServerStats } from "./batching_server.js";
export { ToolParser, HermesToolParser, registerToolParser, getToolParser, toolParserNames, parseCallJson, type FunctionCall, type ToolParseResult, type ToolParserClass } from "./tool_parser.js";
export { resolveAgentLoopSettings, type AgentLoopSettings, type TruncateSide } from "./settings.js";
export { AgentLoopResources } from "./resources.js";
export { chatTemplateIds, defaultSystemPromptText } from "./chat.js";
export { truncateToolResponse } from "./truncate.js";
export { loadExport, loadClass } from "./module_spec.js";
export { NamedRegistry } from "./named_registry.js";
export { buildRolloutTensors } from "./postprocess.js";
