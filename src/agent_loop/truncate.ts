// Long tool outputs are cut to rollout.multi_turn.max_tool_response_length
// characters with verl's exact markers, so prompts match verl's token for token.
// Lengths count code points, as Python's len() does.
import type { TruncateSide } from "./settings.js";

export function truncateToolResponse(text: string, maxLength: number, side: TruncateSide): string {
  const chars = Array.from(text);
  if (chars.length <= maxLength) return text;
  const head = (n: number) => chars.slice(0, n).join("");
  const tail = (n: number) => chars.slice(chars.length - n).join("");
  if (side === "left") return head(maxLength) + "...(truncated)";
  if (side === "right") return "(truncated)..." + tail(maxLength);
  const half = Math.floor(maxLength / 2);
  // Python's text[-0:] is the whole string; half is 0 only when maxLength is 1.
  return head(half) + "...(truncated)..." + (half === 0 ? text : tail(half));
}
