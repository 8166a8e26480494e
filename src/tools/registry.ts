// Tools from a YAML file, verl's layout:
//   tools:
//     - class_name: "Gsm8kTool"            # a built-in, or "path/to/module.js#ExportName"
//       config: {type: native, ...}        # handed to the constructor
//       tool_schema: {type: function, function: {name, description, parameters}}
// Built-in classes register here by name; verl's dotted names are aliases so
// verl tool configs load unchanged.
import { dirname } from "node:path";
import { NamedRegistry } from "../agent_loop/named_registry.js";
import { loadClass } from "../agent_loop/module_spec.js";
import { isMapping, readYamlFile } from "../agent_loop/yaml_file.js";
import { BaseTool, type ToolClass } from "./base_tool.js";
import { Gsm8kTool } from "./gsm8k_tool.js";
import { parseToolSchema } from "./schemas.js";

const toolClasses = new NamedRegistry<ToolClass>("tool class");

export function registerToolClass(name: string, cls: ToolClass): void {
  toolClasses.register(name, cls);
}

export function toolClassNames(): string[] {
  return toolClasses.names();
}

/** Build the tools a YAML file lists; tool names must be unique. */
export async function loadToolsFromConfig(path: string): Promise<BaseTool[]> {
  const { data, absPath } = readYamlFile(path, "tool config");
  if (!isMapping(data) || !Array.isArray(data.tools)) throw new Error(`tool config ${path}: expected a top-level 'tools:' list`);
  const tools: BaseTool[] = [];
  for (const [i, entry] of data.tools.entries()) {
    const where = `tool config ${path}, tools[${i}]`;
    if (!isMapping(entry)) throw new Error(`${where}: each entry must be a mapping with class_name, config, tool_schema`);
    if (typeof entry.class_name !== "string") throw new Error(`${where}: class_name must be a string`);
    const config = entry.config ?? {};
    if (!isMapping(config)) throw new Error(`${where}: config must be a mapping`);
    const type = config.type ?? "native";
    if (type === "mcp") throw new Error(`${where}: MCP tools (config.type: mcp) are not supported by verl-ts; write a native tool class`);
    if (type !== "native") throw new Error(`${where}: config.type must be 'native', got ${JSON.stringify(type)}`);
    const schema = entry.tool_schema === undefined || entry.tool_schema === null ? null : parseToolSchema(entry.tool_schema, where);
    const cls = await loadClass<BaseTool>(entry.class_name, {
      baseDir: dirname(absPath),
      builtins: toolClasses.asMap(),
      what: `${where}: class_name`,
    });
    let tool: unknown;
    try {
      tool = new (cls as unknown as ToolClass)(structuredClone(config), schema);
    } catch (e) {
      throw new Error(`${where}: constructing ${entry.class_name} failed: ${(e as Error).message}`);
    }
    if (!(tool instanceof BaseTool)) throw new Error(`${where}: ${entry.class_name} does not extend BaseTool`);
    if (tools.some((t) => t.name === tool.name)) throw new Error(`${where}: a tool named '${tool.name}' is already defined`);
    tools.push(tool);
  }
  return tools;
}

registerToolClass("Gsm8kTool", Gsm8kTool);
registerToolClass("verl.tools.gsm8k_tool.Gsm8kTool", Gsm8kTool);
