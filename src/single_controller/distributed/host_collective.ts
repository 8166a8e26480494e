// Collectives for a rank whose pool spans hosts, hierarchical: the ranks of one
// host reduce over shared memory (collective.ts), local rank 0 takes the host's
// partial result across hosts (bridge -> the host's main thread -> ring.ts), and
// shares the answer with its host's ranks. "mean" is summed everywhere and then
// divided by the world size, the same on every rank, so all ranks hold the same bits.
// reduceScatter across hosts is a whole allReduce (the ring sums an element in an
// order set by where it lies in the request, so only that keeps allReduce's bits);
// allGather gathers each host's block locally, passes the blocks along the ring
// from their hosts and shares the whole with the host's ranks.
import { checkBounds, Collective, type CallInfo, type RankCollective, type ReduceOp } from "../collective.js";
import { CollectiveError } from "../errors.js";
import { BridgeClient, type BridgeBuffers, type BridgeDtype, type BridgeOp } from "./bridge.js";

export interface HostLayout {
  /** This host's index (NODE_RANK) and the number of hosts. */
  hostIndex: number;
  nnodes: number;
  /** Ranks per host; global rank = hostIndex * localWorldSize + localRank. */
  localWorldSize: number;
  bridge: BridgeBuffers;
}

export class HierarchicalCollective implements RankCollective {
  readonly rank: number;
  readonly worldSize: number;
  private readonly bridge: BridgeClient | undefined;
  private call: CallInfo | undefined;

  constructor(private readonly local: Collective, private readonly layout: HostLayout) {
    this.worldSize = layout.nnodes * layout.localWorldSize;
    this.rank = layout.hostIndex * layout.localWorldSize + local.rank;
    // Waits a little longer than the ring so the ring's own timeout, which names the host, comes first.
    this.bridge = local.rank === 0 ? new BridgeClient(layout.bridge, local.timeoutMs + 5000, { me: layout.hostIndex, hosts: layout.nnodes }) : undefined;
  }

  /** A float32 buffer crosses in requests of the bridge's size, each with its own ring segments. */
  get bucketAlignElems(): number | undefined {
    return this.layout.nnodes > 1 ? this.layout.bridge.dataBytes / 4 : undefined;
  }

  /** The leader's lies in the bridge memory (reduced there in place); other ranks' are plain. */
  reduceBuffer(elems: number): Float32Array {
    return (this.layout.nnodes > 1 ? this.bridge?.reduceBuffer(elems) : undefined) ?? new Float32Array(elems);
  }

  get timeoutMs(): number {
    return this.local.timeoutMs;
  }

  setCall(call: CallInfo | undefined): void {
    this.call = call;
    const participants = call && call.participants === this.worldSize ? this.layout.localWorldSize : call?.participants;
    this.local.setCall(call ? { method: call.method, participants: participants! } : undefined);
  }

  abort(reason: string): void {
    this.local.abort(reason);
  }

  barrier(): void {
    this.enter("barrier");
    this.local.barrier();
    this.acrossHosts("barrier", () => this.bridge!.request("barrier", "bytes", new Uint8Array(0), 0));
    this.local.barrier();
  }

  allReduce(buf: Float32Array | Float64Array, op: ReduceOp = "sum"): void {
    const is64 = buf instanceof Float64Array;
    if (!is64 && !(buf instanceof Float32Array)) throw new TypeError("allReduce: buf must be a Float32Array or a Float64Array");
    if (!["sum", "mean", "max", "min"].includes(op)) throw new Error(`allReduce: op must be one of sum, mean, max, min, got '${String(op)}'`);
    this.enter("allReduce");
    const partial: BridgeOp = op === "mean" ? "sum" : op;
    // Across hosts the leader divides as it copies the result out (the same x / world, so the same
    // bits), and its host's ranks take the quotient from the broadcast: no extra pass on any rank.
    const fused = op === "mean" && this.layout.nnodes > 1;
    this.local.allReduce(buf, partial);
    this.acrossHosts("allReduce", () => this.chunked(buf, (chunk, n) => this.bridge!.request(partial, is64 ? "float64" : "float32", chunk, n, 0, fused ? this.worldSize : 1)));
    this.local.broadcast(buf, 0);
    if (op === "mean" && !fused) {
      const w = this.worldSize;
      for (let i = 0; i < buf.length; i++) buf[i] = buf[i]! / w;
    }
  }

  reduceScatter(buf: Float32Array, bounds: ArrayLike<number>): void {
    checkBounds("reduceScatter", buf, bounds, this.worldSize, true);
    if (this.layout.nnodes === 1) {
      this.enter("reduceScatter");
      this.local.reduceScatter(buf, bounds);
      return;
    }
    this.allReduce(buf, "sum");
  }

  allGather(buf: Float32Array, bounds: ArrayLike<number>): void {
    checkBounds("allGather", buf, bounds, this.worldSize, false);
    this.enter("allGather");
    const L = this.layout.localWorldSize, H = this.layout.nnodes, h = this.layout.hostIndex;
    this.local.allGather(buf, Array.from(bounds).slice(h * L, (h + 1) * L + 1));
    if (H === 1) return;
    this.acrossHosts("allGather", () => {
      for (let g = 0; g < H; g++) {
        const a = bounds[g * L]!, b = bounds[(g + 1) * L]!;
        // every host computes the same bounds, so every host skips the same empty blocks
        if (a === b) continue;
        const block = new Uint8Array(buf.buffer, buf.byteOffset + a * 4, (b - a) * 4);
        this.chunked(block, (chunk, n) => this.bridge!.request("broadcast", "bytes", chunk, n, g));
      }
    });
    this.local.broadcast(buf.subarray(bounds[0]!, bounds[this.worldSize]!), 0);
  }

  broadcast(buf: ArrayBufferView, root = 0): void {
    if (!ArrayBuffer.isView(buf)) throw new TypeError("broadcast: buf must be a typed array");
    if (!Number.isInteger(root) || root < 0 || root >= this.worldSize) throw new Error(`broadcast: root ${root} is not a rank in [0, ${this.worldSize})`);
    this.enter("broadcast");
    const L = this.layout.localWorldSize;
    const rootHost = Math.floor(root / L);
    const home = rootHost === this.layout.hostIndex;
    if (home) this.local.broadcast(buf, root % L);
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    this.acrossHosts("broadcast", () => this.chunked(bytes, (chunk, n) => this.bridge!.request("broadcast", "bytes", chunk, n, rootHost)));
    if (!home) this.local.broadcast(buf, 0);
  }

  private enter(op: string): void {
    if (this.call && this.call.participants !== this.worldSize) {
      throw new CollectiveError(
        `collective ${op} on rank ${this.rank} in '${this.call.method}': this call runs on ${this.call.participants} of ${this.worldSize} ranks ` +
          "(execute mode RANK_ZERO); collectives need every rank of the group",
        "aborted",
      );
    }
  }

  /** The leader's cross-host step; a failure also releases this host's other ranks. */
  private acrossHosts(op: string, fn: () => void): void {
    if (!this.bridge || this.layout.nnodes === 1) return;
    try {
      fn();
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      this.local.abort(`rank ${this.rank} (host ${this.layout.hostIndex}) failed ${op} across hosts: ${msg}`);
      throw e instanceof CollectiveError ? e : new CollectiveError(msg, "aborted");
    }
  }

  /** Feeds `buf` to `fn` in pieces that fit the bridge, as bytes; `n` is the piece's element count. */
  private chunked(buf: ArrayBufferView, fn: (chunk: Uint8Array, n: number) => void): void {
    const bpe = (buf as { BYTES_PER_ELEMENT?: number }).BYTES_PER_ELEMENT ?? 1;
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    const step = Math.floor(this.bridge!.capacityBytes / bpe) * bpe;
    let off = 0;
    do {
      const len = Math.min(step, bytes.length - off);
      const chunk = bytes.subarray(off, off + len);
      fn(chunk, len / bpe);
      off += len;
    } while (off < bytes.length);
  }
}
