//! Idempotency keys equal the Python reference of SPEC 3.1 for hundreds of
//! generated args: non-ASCII text, control characters, huge integers,
//! floats in every notation, nested objects with unsorted keys.

use crate::env::{TestEnv, agents_dir, text};

/// A small deterministic generator (xorshift64*), so failures reproduce.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// `min` to `min + span - 1` digits, no leading zero.
    fn digits(&mut self, min: usize, span: u64) -> String {
        let count = min + self.below(span) as usize;
        let mut out = String::new();
        out.push(char::from(b'1' + self.below(9) as u8));
        for _ in 1..count {
            out.push(char::from(b'0' + self.below(10) as u8));
        }
        out
    }

    fn number(&mut self) -> String {
        match self.below(9) {
            0 => self
                .pick(&[
                    "0",
                    "-0",
                    "1",
                    "-1",
                    "0.0",
                    "-0.0",
                    "1.0",
                    "1e5",
                    "1E5",
                    "1e-5",
                    "1e16",
                    "1e15",
                    "1e400",
                    "-1e400",
                    "1e-400",
                    "0.1",
                    "0.30000000000000004",
                    "1.5e300",
                    "2.5",
                    "1e+2",
                    "123e-2",
                    "4.35",
                    "0.0001",
                    "0.00001",
                ])
                .to_owned(),
            1 => {
                let sign = if self.below(2) == 0 { "-" } else { "" };
                format!("{sign}{}", self.digits(1, 18))
            }
            2 => self.digits(19, 400),
            3 => format!("{:e}", f64::from_bits(self.next()))
                .replace("NaN", "1.5")
                .replace("inf", "1e999"),
            4 => {
                let value = f64::from_bits(self.next());
                if value.is_finite() {
                    format!("{value}")
                } else {
                    "2.0".to_owned()
                }
            }
            5 => {
                let whole = self.digits(1, 10);
                format!("{whole}.{}", self.digits(1, 20))
            }
            6 => {
                let mantissa = self.digits(1, 20);
                let sign = self.pick(&["", "+", "-"]);
                format!("{mantissa}e{sign}{}", self.below(330))
            }
            7 => {
                let zeros = "0".repeat(self.below(8) as usize);
                format!("0.{zeros}{}", self.digits(1, 17))
            }
            _ => format!("{}", (self.next() as f64) / 1e10),
        }
    }

    fn string(&mut self) -> String {
        let mut out = String::from("\"");
        for _ in 0..self.below(12) {
            match self.below(10) {
                0 => out.push_str(self.pick(&[
                    "\\n",
                    "\\t",
                    "\\\"",
                    "\\\\",
                    "\\/",
                    "\\b",
                    "\\f",
                    "\\r",
                    "\\u0000",
                    "\\u001f",
                    "\\u007f",
                    "\\u00e9",
                    "\\ud83d\\ude00",
                    "\\uffff",
                ])),
                1 => out.push(char::from_u32(0x80 + self.below(0x780) as u32).unwrap_or('é')),
                2 => out.push(char::from_u32(0x800 + self.below(0xD000) as u32).unwrap_or('€')),
                3 => out.push(char::from_u32(0x10000 + self.below(0x10000) as u32).unwrap_or('😀')),
                4 => out.push('\u{7f}'),
                _ => out.push(
                    char::from(b' ' + self.below(95) as u8)
                        .to_string()
                        .replace(['"', '\\'], "x")
                        .chars()
                        .next()
                        .unwrap_or('x'),
                ),
            }
        }
        out.push('"');
        out
    }

    fn value(&mut self, depth: u32) -> String {
        let kinds = if depth >= 3 { 5 } else { 7 };
        match self.below(kinds) {
            0 => self.pick(&["null", "true", "false"]).to_owned(),
            1 | 2 => self.number(),
            3 | 4 => self.string(),
            5 => {
                let items: Vec<String> =
                    (0..self.below(4)).map(|_| self.value(depth + 1)).collect();
                format!("[{}]", items.join(self.pick(&[",", ", ", " , "])))
            }
            _ => self.object(depth),
        }
    }

    fn object(&mut self, depth: u32) -> String {
        let members: Vec<String> = (0..self.below(5))
            .map(|_| {
                let key = if self.below(3) == 0 {
                    self.string()
                } else {
                    format!(
                        "\"{}\"",
                        self.pick(&[
                            "b", "a", "B", "é", "aa", "_", "Z", "\\u00e9", "😀", "a\\u0000"
                        ])
                    )
                };
                format!("{key}:{}", self.value(depth + 1))
            })
            .collect();
        format!("{{{}}}", members.join(","))
    }
}

/// The args both key tests send: 400 generated values (every other one an
/// object), a surrogate pair, and an integer of Python's longest.
fn corpus() -> Vec<String> {
    let mut generator = Gen(0x9E37_79B9_7F4A_7C15);
    let mut texts: Vec<String> = (0..400)
        .map(|i| {
            if i % 2 == 0 {
                generator.object(0)
            } else {
                generator.value(0)
            }
        })
        .collect();
    texts.push("\"\\ud800\\udc00 pair\"".to_owned());
    texts.push(format!("{{\"n\": {}}}", "9".repeat(4300)));
    texts
}

#[test]
fn keys_equal_the_python_reference_for_generated_args() {
    let env = TestEnv::new();
    let texts = corpus();
    let args = env.write("args.jsonl", &texts.join("\n"));
    let report = env.path("report.json");
    let output = env
        .command()
        .args(["-q", "run", "--", "python3"])
        .arg(agents_dir().join("keys.py"))
        .arg(&args)
        .arg(&report)
        .output()
        .expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("JSON");
    assert_eq!(report["checked"], texts.len());
    let mismatches = report["mismatches"].as_array().expect("mismatches");
    assert!(
        mismatches.is_empty(),
        "{} of {} keys differ: {mismatches:#?}",
        mismatches.len(),
        texts.len()
    );
}

/// The Node SDK derives the key of a new `read` step itself (its `begin`
/// is posted, not awaited): the same generated args, each step's body
/// reading its key, which the SDK checks against durun's answer.
#[test]
fn the_node_sdks_own_keys_equal_durun_keys_for_generated_args() {
    let env = TestEnv::new();
    let texts = corpus();
    let args = env.write("args.jsonl", &texts.join("\n"));
    let report = env.path("report.json");
    let output = env
        .command()
        .args(["-q", "run", "--task", "keys", "--", "node"])
        .arg(agents_dir().join("node_keys.mjs"))
        .arg(&args)
        .arg(&report)
        .output()
        .expect("durun");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("JSON");
    let mismatches = report["mismatches"].as_array().expect("mismatches");
    assert!(
        mismatches.is_empty(),
        "{} keys differ: {mismatches:#?}",
        mismatches.len()
    );
    // Only what a double cannot hold is left out (1e400, a 4,300-digit
    // integer): JavaScript reads it as Infinity, which the SDK refuses.
    let skipped = report["skipped"].as_array().expect("skipped");
    for text in skipped {
        let value: serde_json::Value =
            serde_json::from_str(text.as_str().expect("text")).expect("JSON");
        assert!(
            holds_infinity(&value),
            "skipped, yet a double holds it: {text}"
        );
    }
    let checked = report["checked"].as_u64().expect("checked");
    assert!(checked >= 300, "only {checked} of {} checked", texts.len());
    assert_eq!(checked as usize + skipped.len(), texts.len());
    // Every step was journaled, its output the key its body saw.
    let view = env.inspect("keys");
    let steps = view["steps"].as_array().expect("steps");
    assert_eq!(steps.len() as u64, checked);
    for step in steps {
        assert_eq!(step["output"], step["idempotency_key"], "{step}");
    }
}

/// Whether a number in `value` is past a double's range.
fn holds_infinity(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(number) => number
            .to_string()
            .parse::<f64>()
            .is_ok_and(f64::is_infinite),
        serde_json::Value::Array(items) => items.iter().any(holds_infinity),
        serde_json::Value::Object(members) => members.values().any(holds_infinity),
        _ => false,
    }
}
