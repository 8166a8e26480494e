// Public surface of the tools layer.
export { BaseTool, type ToolClass, type ToolCallContext, type ToolCreateOptions, type ToolExecution } from "./base_tool.js";
export {
  parseToolSchema, checkToolResponse,
  type OpenAIFunctionToolSchema, type OpenAIFunctionSchema, type OpenAIFunctionParametersSchema, type OpenAIFunctionPropertySchema, type ToolResponse,
} from "./schemas.js";
export { Gsm8kTool, GSM8K_TOOL_SCHEMA } from "./gsm8k_tool.js";
export { loadToolsFromConfig, registerToolClass, toolClassNames } from "./registry.js";
export { pyStrRepr, pyFloatRepr } from "./py_repr.js";
