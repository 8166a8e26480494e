// Agent loops by name. Code registers classes with registerAgentLoop; a YAML
// file (rollout.agent.agent_loop_config_path) adds entries per manager:
//   - name: my_agent
//     _target_: ./my_agent.js#MyAgentLoop   # or a built-in class name
//     max_turns: 5                          # any other keys reach the loop as ctx.kwargs
// Each dataset row picks its loop by `agent_name` (default
// rollout.agent.default_agent_loop).
import { dirname } from "node:path";
import type { AgentLoopClass } from "./base.js";
import { loadClass } from "./module_spec.js";
import { NamedRegistry } from "./named_registry.js";
import { SingleTurnAgentLoop } from "./single_turn.js";
import { ToolAgentLoop } from "./tool_agent.js";
import { isMapping, readYamlFile } from "./yaml_file.js";

const agentLoops = new NamedRegistry<AgentLoopClass>("agent loop");
/** Built-in classes by the names a YAML _target_ may use (ours and verl's dotted ones). */
const builtinTargets = new NamedRegistry<AgentLoopClass>("agent loop class");

export function registerAgentLoop(name: string, cls: AgentLoopClass): void {
  agentLoops.register(name, cls);
}

export function getAgentLoopClass(name: string): AgentLoopClass {
  return agentLoops.get(name);
}

export function agentLoopNames(): string[] {
  return agentLoops.names();
}

export interface AgentLoopSpec {
  name: string;
  cls: AgentLoopClass;
  kwargs: Record<string, unknown>;
}

/** Read an agent-loop config; names already registered in code must name the same class. */
export async function loadAgentLoopConfig(path: string): Promise<AgentLoopSpec[]> {
  const { data, absPath } = readYamlFile(path, "agent loop config");
  if (!Array.isArray(data)) throw new Error(`agent loop config ${path}: expected a list of {name, _target_, ...}`);
  const specs: AgentLoopSpec[] = [];
  for (const [i, entry] of data.entries()) {
    const where = `agent loop config ${path}, entry ${i}`;
    if (!isMapping(entry)) throw new Error(`${where}: expected a mapping {name, _target_, ...}`);
    const { name, _target_: target, ...kwargs } = entry;
    if (typeof name !== "string" || name.length === 0) throw new Error(`${where}: 'name' must be a non-empty string`);
    if (typeof target !== "string") throw new Error(`${where}: '_target_' must be a 'path/to/module.js#ExportName' string`);
    if (specs.some((s) => s.name === name)) throw new Error(`${where}: agent loop '${name}' is listed twice`);
    const cls = (await loadClass(target, { baseDir: dirname(absPath), builtins: builtinTargets.asMap(), what: `${where}: _target_` })) as unknown as AgentLoopClass;
    if (agentLoops.has(name) && agentLoops.get(name) !== cls) {
      throw new Error(`${where}: agent loop '${name}' is already registered with a different class`);
    }
    specs.push({ name, cls, kwargs });
  }
  return specs;
}

registerAgentLoop("single_turn_agent", SingleTurnAgentLoop);
registerAgentLoop("tool_agent", ToolAgentLoop);
for (const [cls, names] of [
  [SingleTurnAgentLoop, ["SingleTurnAgentLoop", "verl.experimental.agent_loop.single_turn_agent_loop.SingleTurnAgentLoop"]],
  [ToolAgentLoop, ["ToolAgentLoop", "verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop"]],
] as const) {
  for (const n of names) builtinTargets.register(n, cls);
}
