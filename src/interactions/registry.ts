// Interactions from a YAML file, verl's layout:
//   interaction:
//     - name: gsm8k                       # optional; else the class name minus "Interaction", lower-cased
//       class_name: "Gsm8kInteraction"    # a built-in, or "path/to/module.js#ExportName"
//       config: {}
// A row picks one with extra_info.interaction_kwargs.name.
import { dirname } from "node:path";
import { NamedRegistry } from "../agent_loop/named_registry.js";
import { loadClass } from "../agent_loop/module_spec.js";
import { isMapping, readYamlFile } from "../agent_loop/yaml_file.js";
import { BaseInteraction, type InteractionClass } from "./base.js";
import { Gsm8kInteraction } from "./gsm8k_interaction.js";

const interactionClasses = new NamedRegistry<InteractionClass>("interaction class");

export function registerInteractionClass(name: string, cls: InteractionClass): void {
  interactionClasses.register(name, cls);
}

export function interactionClassNames(): string[] {
  return interactionClasses.names();
}

function defaultName(className: string): string {
  const simple = className.split(/[#./]/).pop() ?? className;
  return (simple.endsWith("Interaction") ? simple.slice(0, -"Interaction".length) : simple).toLowerCase();
}

export async function loadInteractionsFromConfig(path: string): Promise<Map<string, BaseInteraction>> {
  const { data, absPath } = readYamlFile(path, "interaction config");
  if (!isMapping(data) || !Array.isArray(data.interaction)) {
    throw new Error(`interaction config ${path}: expected a top-level 'interaction:' list`);
  }
  const out = new Map<string, BaseInteraction>();
  for (const [i, entry] of data.interaction.entries()) {
    const where = `interaction config ${path}, interaction[${i}]`;
    if (!isMapping(entry) || typeof entry.class_name !== "string") throw new Error(`${where}: needs a string class_name`);
    const config = entry.config ?? {};
    if (!isMapping(config)) throw new Error(`${where}: config must be a mapping`);
    if (entry.name !== undefined && typeof entry.name !== "string") throw new Error(`${where}: name must be a string`);
    const name = entry.name ?? defaultName(entry.class_name);
    if (out.has(name)) throw new Error(`${where}: duplicate interaction name '${name}'; each interaction needs a unique name`);
    const cls = await loadClass<BaseInteraction>(entry.class_name, {
      baseDir: dirname(absPath),
      builtins: interactionClasses.asMap(),
      what: `${where}: class_name`,
    });
    const interaction: unknown = new (cls as unknown as InteractionClass)({ ...structuredClone(config), name });
    if (!(interaction instanceof BaseInteraction)) throw new Error(`${where}: ${entry.class_name} does not extend BaseInteraction`);
    out.set(name, interaction);
  }
  return out;
}

registerInteractionClass("Gsm8kInteraction", Gsm8kInteraction);
registerInteractionClass("verl.interactions.gsm8k_interaction.Gsm8kInteraction", Gsm8kInteraction);
