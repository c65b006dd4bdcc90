// Keys as durun derives them (SPEC 3.1 of the protocol doc): the SDK
// derives a posted step's key itself, before durun's answer comes.

import { createRequire } from "node:module";

// node:crypto is loaded at the first key (a first run may need none): it
// costs milliseconds of a script's start.
let sha256 = (text) => {
  const crypto = createRequire(import.meta.url)("node:crypto");
  // One call, where Node has it (20.12 and later): a third of the cost of
  // a Hash object, which a replayed step would pay.
  sha256 = crypto.hash
    ? (data) => crypto.hash("sha256", data, "hex")
    : (data) => crypto.createHash("sha256").update(data, "utf8").digest("hex");
  return sha256(text);
};

/** SPEC 3.1: sha256 of `TASK:STEP:` and the args as Python's
 * `json.dumps(args, sort_keys=True)` prints what durun reads. */
export function idempotencyKey(task, step, args) {
  return sha256(`${task}:${step}:${canonicalJson(args)}`);
}

/** `json.dumps(value, sort_keys=True)` of what Python's `json.loads` reads
 * from `JSON.stringify(value)`. */
export function canonicalJson(value) {
  if (value === null || value === undefined) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "number") return pythonNumber(value);
  if (typeof value === "string") return pythonString(value);
  if (Array.isArray(value)) return `[${value.map((item) => (item === undefined ? "null" : canonicalJson(item))).join(", ")}]`;
  const keys = Object.keys(value).filter((key) => value[key] !== undefined).sort(byCodePoint);
  return `{${keys.map((key) => `${pythonString(key)}: ${canonicalJson(value[key])}`).join(", ")}}`;
}

function byCodePoint(a, b) {
  for (let i = 0; i < a.length && i < b.length; i++) {
    const x = a.codePointAt(i);
    const y = b.codePointAt(i);
    if (x !== y) return x - y;
    if (x > 0xffff) i++;
  }
  return a.length - b.length;
}

// A literal with `.`, `e` or `E` is a float to Python, printed by `repr`:
// the shortest digits that read back (as JavaScript's), in fixed notation
// for exponents -4 to 15, else as `1.5e-07`, `1e+16`.
function pythonNumber(n) {
  const text = JSON.stringify(n);
  if (!/[.eE]/.test(text)) return text;
  const [mantissa, exponent] = Math.abs(n).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const e = Number(exponent);
  const sign = n < 0 ? "-" : "";
  if (e >= -4 && e < 16) {
    if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
    const whole = digits.slice(0, e + 1).padEnd(e + 1, "0");
    return `${sign}${whole}.${digits.slice(e + 1) || "0"}`;
  }
  const rest = digits.slice(1);
  return `${sign}${digits[0]}${rest ? `.${rest}` : ""}e${e < 0 ? "-" : "+"}${String(Math.abs(e)).padStart(2, "0")}`;
}

const SHORT_ESCAPES = { 0x22: '\\"', 0x5c: "\\\\", 0x0a: "\\n", 0x0d: "\\r", 0x09: "\\t", 0x08: "\\b", 0x0c: "\\f" };

function pythonString(text) {
  let out = '"';
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (SHORT_ESCAPES[unit] !== undefined) out += SHORT_ESCAPES[unit];
    else if (unit < 0x20 || unit > 0x7e) out += `\\u${unit.toString(16).padStart(4, "0")}`;
    else out += text[i];
  }
  return `${out}"`;
}
