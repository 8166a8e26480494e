// A value model for critics and reward models: the Llama trunk plus a linear
// `score` head giving one number per position (HF's *ForTokenClassification
// with num_labels = 1, which is what verl's critic loads).
import * as tf from "@tensorflow/tfjs";
import { linear } from "../engine/matmul.js";
import type { Rng } from "../utils/rng.js";
import type { ModelConfig } from "./config.js";
import { initTensors } from "./init.js";
import { LlamaModel, parameterShapes, toVariables, type ForwardOptions } from "./llama.js";

export class ValueHeadModel {
  readonly trunk: LlamaModel;
  readonly params: Map<string, tf.Variable>;

  /** `params` holds the trunk's parameters (no lm_head needed) and score.weight [1, dim], score.bias [1]. */
  constructor(readonly config: ModelConfig, params: Map<string, tf.Variable>) {
    const trunkParams = new Map([...params].filter(([n]) => !n.startsWith("score.") && n !== "lm_head.weight"));
    for (const [n, shape] of [["score.weight", [1, config.dim]], ["score.bias", [1]]] as const) {
      const v = params.get(n);
      if (!v) throw new Error(`ValueHeadModel: missing parameter '${n}'`);
      if (v.shape.join(",") !== shape.join(",")) throw new Error(`ValueHeadModel: '${n}' has shape [${v.shape}], expected [${shape}]`);
    }
    this.trunk = new LlamaModel(config, trunkParams, { lmHead: false });
    this.params = new Map([...trunkParams, ["score.weight", params.get("score.weight")!], ["score.bias", params.get("score.bias")!]]);
  }

  /** Values [B, T]: the score head on the final hidden states. */
  forward(inputIds: tf.Tensor2D, opts: ForwardOptions = {}): tf.Tensor2D {
    return tf.tidy(() => {
      const h = this.trunk.hiddenStates(inputIds, opts);
      const [B, T] = inputIds.shape;
      const w = this.params.get("score.weight")!, b = this.params.get("score.bias")!;
      return linear(h, w as tf.Tensor2D).add(b).reshape([B, T]) as tf.Tensor2D;
    });
  }

  /** What trains, by name: under LoRA the trunk's adapter and the score head (peft's token-classification head), else everything. */
  trainableParams(): Map<string, tf.Variable> {
    if (!this.trunk.lora) return this.params;
    return new Map([...this.trunk.lora.namedParams(), ["score.weight", this.params.get("score.weight")!], ["score.bias", this.params.get("score.bias")!]]);
  }

  trainableVariables(): tf.Variable[] {
    return [...this.trainableParams().values()];
  }

  dispose(): void {
    this.trunk.lora?.dispose();
    for (const v of this.params.values()) v.dispose();
    this.params.clear();
  }

  /** A critic initialised from a policy's trunk (copied) and a fresh score head, as verl builds its critic. */
  static fromPolicy(policy: LlamaModel, rng: Rng): ValueHeadModel {
    const t = new Map<string, tf.Tensor>();
    for (const [n, v] of policy.params) if (n !== "lm_head.weight") t.set(n, v);
    const head = initTensors(new Map([["score.weight", [1, policy.config.dim]], ["score.bias", [1]]]), rng);
    try {
      return new ValueHeadModel(policy.config, toVariables(new Map([...t, ...head])));
    } finally {
      tf.dispose([...head.values()]);
    }
  }

  static init(config: ModelConfig, rng: Rng): ValueHeadModel {
    const shapes = parameterShapes(config, { lmHead: false });
    shapes.set("score.weight", [1, config.dim]);
    shapes.set("score.bias", [1]);
    const t = initTensors(shapes, rng);
    try {
      return new ValueHeadModel(config, toVariables(t));
    } finally {
      tf.dispose([...t.values()]);
    }
  }
}
