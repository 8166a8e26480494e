// OpenAI function-tool schemas (what the chat template renders so the model
// knows its tools) and the value a tool returns. Checked on load so a YAML
// typo fails at start-up naming the tool, not mid-rollout.

export interface OpenAIFunctionPropertySchema {
  type: string;
  description?: string;
  enum?: string[];
  [k: string]: unknown;
}

export interface OpenAIFunctionParametersSchema {
  type: string;
  properties: Record<string, OpenAIFunctionPropertySchema>;
  required: string[];
}

export interface OpenAIFunctionSchema {
  name: string;
  description: string;
  parameters?: OpenAIFunctionParametersSchema;
  strict?: boolean;
}

export interface OpenAIFunctionToolSchema {
  type: string;
  function: OpenAIFunctionSchema;
}

/** What a tool hands back to the conversation. Only text reaches the model in this port. */
export interface ToolResponse {
  text?: string;
  image?: unknown[];
  video?: unknown[];
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** Validate a parsed tool_schema; returns a deep copy. `where` names the source in errors. */
export function parseToolSchema(raw: unknown, where: string): OpenAIFunctionToolSchema {
  if (!isRecord(raw)) throw new Error(`${where}: tool_schema must be a mapping`);
  if (typeof raw.type !== "string") throw new Error(`${where}: tool_schema.type must be a string (usually "function")`);
  const fn = raw.function;
  if (!isRecord(fn)) throw new Error(`${where}: tool_schema.function must be a mapping`);
  if (typeof fn.name !== "string" || fn.name.length === 0) throw new Error(`${where}: tool_schema.function.name must be a non-empty string`);
  if (typeof fn.description !== "string") throw new Error(`${where}: tool_schema.function.description must be a string`);
  if (fn.strict !== undefined && typeof fn.strict !== "boolean") throw new Error(`${where}: tool_schema.function.strict must be true or false`);
  const params = fn.parameters;
  if (params !== undefined) {
    if (!isRecord(params) || typeof params.type !== "string") {
      throw new Error(`${where}: tool_schema.function.parameters must be a mapping with a string 'type'`);
    }
    if (!isRecord(params.properties)) throw new Error(`${where}: tool_schema.function.parameters.properties must be a mapping`);
    for (const [name, prop] of Object.entries(params.properties)) {
      if (!isRecord(prop) || typeof prop.type !== "string") {
        throw new Error(`${where}: parameter '${name}' of tool '${fn.name}' needs a string 'type'`);
      }
    }
    if (!Array.isArray(params.required) || params.required.some((r) => typeof r !== "string")) {
      throw new Error(`${where}: tool_schema.function.parameters.required must be a list of names`);
    }
  }
  return structuredClone(raw) as unknown as OpenAIFunctionToolSchema;
}

/** Checks a tool's return value; multimodal parts must be lists, as verl requires. */
export function checkToolResponse(resp: unknown, toolName: string): ToolResponse {
  if (!isRecord(resp)) throw new Error(`tool '${toolName}' returned ${JSON.stringify(resp)} instead of a ToolResponse {text?, image?, video?}`);
  if (resp.text !== undefined && resp.text !== null && typeof resp.text !== "string") {
    throw new Error(`tool '${toolName}' returned a non-string text`);
  }
  for (const k of ["image", "video"] as const) {
    if (resp[k] !== undefined && resp[k] !== null && !Array.isArray(resp[k])) {
      throw new Error(`tool '${toolName}' returned ${k} that is not a list; wrap a single ${k} as [${k}]`);
    }
  }
  return resp as ToolResponse;
}
