import { test } from "node:test";
import assert from "node:assert/strict";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.js";
import { rmsNorm, swiGlu } from "../../src/models/layers.js";
import { Rng } from "../../src/utils/rng.js";

test("rmsNorm and swiGlu: values and hand-written gradients equal autograd of the formulas", async () => {
  for (const backend of ["cpu", "wasm"]) {
    await initBackend(backend);
    const rng = new Rng(3), r = (n: number) => Float32Array.from({ length: n }, () => 2 * rng.normal());
    const x = tf.tensor2d(r(5 * 6), [5, 6]), w = tf.tensor1d(r(6)), up = tf.tensor2d(r(5 * 6), [5, 6]);
    const gu = tf.tensor2d(r(5 * 8), [5, 8]), up2 = tf.tensor2d(r(5 * 4), [5, 4]);
    const close = (a: tf.Tensor, b: tf.Tensor, what: string) => {
      const av = a.dataSync(), bv = b.dataSync();
      av.forEach((v, i) => assert.ok(Math.abs(v - bv[i]!) < 1e-4, `${backend} ${what}[${i}]: ${v} vs ${bv[i]}`));
    };
    const rmsRef = (xs: tf.Tensor, ws: tf.Tensor) => xs.mul(tf.rsqrt(xs.square().mean(-1, true).add(1e-5))).mul(ws);
    close(rmsNorm(x, w, 1e-5), rmsRef(x, w), "rms");
    const gOurs = tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a, b, 1e-5).mul(up).sum())([x, w]);
    const gRef = tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsRef(a, b).mul(up).sum())([x, w]);
    close(gOurs[0]!, gRef[0]!, "rms dx"); close(gOurs[1]!, gRef[1]!, "rms dw");
    const gluRef = (t: tf.Tensor) => { const [g, u] = tf.split(t, 2, 1); return g!.mul(tf.sigmoid(g!)).mul(u!); };
    close(swiGlu(gu), gluRef(gu), "swiglu");
    close(tf.grad((t: tf.Tensor) => swiGlu(t as tf.Tensor2D).mul(up2).sum())(gu), tf.grad((t: tf.Tensor) => gluRef(t).mul(up2).sum())(gu), "swiglu grad");
  }
});
