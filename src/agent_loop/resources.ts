// Tools and interactions are built once per manager and shared by every
// loop (verl builds them per sample); they keep per-trajectory state under
// instance ids, so sharing is safe and saves re-reading YAML per row.
import type { BaseInteraction } from "../interactions/base.js";
import { loadInteractionsFromConfig } from "../interactions/registry.js";
import type { BaseTool } from "../tools/base_tool.js";
import { loadToolsFromConfig } from "../tools/registry.js";

export class AgentLoopResources {
  private readonly toolCache = new Map<string, Promise<BaseTool[]>>();
  private readonly interactionCache = new Map<string, Promise<Map<string, BaseInteraction>>>();

  /** The tools a tool config lists (none for a null path). */
  tools(path: string | null): Promise<BaseTool[]> {
    if (path === null) return Promise.resolve([]);
    let p = this.toolCache.get(path);
    if (!p) {
      p = loadToolsFromConfig(path);
      this.toolCache.set(path, p);
    }
    return p;
  }

  /** The interactions an interaction config lists, by name (none for a null path). */
  interactions(path: string | null): Promise<Map<string, BaseInteraction>> {
    if (path === null) return Promise.resolve(new Map());
    let p = this.interactionCache.get(path);
    if (!p) {
      p = loadInteractionsFromConfig(path);
      this.interactionCache.set(path, p);
    }
    return p;
  }
}
