//! What a model call cost (SPEC 19): a built-in, dated table of OpenAI's
//! and Anthropic's per-token prices, `[prices."MODEL"]` in durun.toml over
//! it, and a call's usage read at its model's price.
//!
//! Money is counted in nano-dollars (10⁻⁹ USD), whole numbers: a price of
//! $0.075 per million tokens is 75 nano-dollars a token, so every cost and
//! sum is exact, and a journal column holds it as an integer.

use std::collections::BTreeMap;

use serde_json::Value;

/// A model's price, in nano-dollars a token (USD per million tokens ×
/// 1,000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Price {
    pub(crate) input: u64,
    pub(crate) output: u64,
    /// Input read from the provider's prompt cache.
    pub(crate) cached_input: u64,
    /// The most output tokens one call may get: a budget's worst case
    /// for a request that sets none.
    pub(crate) max_output: Option<u64>,
}

impl Price {
    /// A price given in USD per million tokens, as price lists and
    /// durun.toml write it.
    pub(crate) fn per_million(input: f64, output: f64, cached_input: Option<f64>) -> Self {
        // Prices are positive and at most a few hundred dollars: the
        // casts cannot lose more than the rounding to a thousandth.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let nanos = |usd: f64| (usd * 1000.0).round().max(0.0) as u64;
        Self {
            input: nanos(input),
            output: nanos(output),
            cached_input: nanos(cached_input.unwrap_or(input)),
            max_output: None,
        }
    }
}

/// Built-in prices by model name (a dated model id, `gpt-4o-2024-08-06`,
/// takes the price of its longest listed prefix), USD per million tokens:
/// input, output, cached input; then the model's output limit in tokens.
/// Read in June 2026 off OpenAI's and Anthropic's published price lists
/// and model pages; `[prices."MODEL"]` overrides any.
const BUILT_IN: &[(&str, f64, f64, f64, u64)] = &[
    // OpenAI
    ("gpt-5.5", 5.0, 30.0, 0.5, 128_000),
    ("gpt-5.4", 2.5, 15.0, 0.25, 128_000),
    ("gpt-5.4-mini", 0.75, 4.5, 0.075, 128_000),
    ("gpt-5.4-nano", 0.2, 1.25, 0.02, 128_000),
    ("gpt-5.1", 1.25, 10.0, 0.125, 128_000),
    ("gpt-5", 1.25, 10.0, 0.125, 128_000),
    ("gpt-5-mini", 0.25, 2.0, 0.025, 128_000),
    ("gpt-5-nano", 0.05, 0.4, 0.005, 128_000),
    ("gpt-4.1", 2.0, 8.0, 0.5, 32_768),
    ("gpt-4.1-mini", 0.4, 1.6, 0.1, 32_768),
    ("gpt-4.1-nano", 0.1, 0.4, 0.025, 32_768),
    ("gpt-4o", 2.5, 10.0, 1.25, 16_384),
    ("gpt-4o-mini", 0.15, 0.6, 0.075, 16_384),
    ("o3", 2.0, 8.0, 0.5, 100_000),
    ("o3-mini", 1.1, 4.4, 0.55, 100_000),
    ("o4-mini", 1.1, 4.4, 0.275, 100_000),
    // Anthropic (cache reads at a tenth of input)
    ("claude-opus-4-6", 5.0, 25.0, 0.5, 128_000),
    ("claude-opus-4-5", 5.0, 25.0, 0.5, 64_000),
    ("claude-opus-4-1", 15.0, 75.0, 1.5, 32_000),
    ("claude-opus-4", 15.0, 75.0, 1.5, 32_000),
    ("claude-sonnet-4-6", 3.0, 15.0, 0.3, 64_000),
    ("claude-sonnet-4-5", 3.0, 15.0, 0.3, 64_000),
    ("claude-sonnet-4", 3.0, 15.0, 0.3, 64_000),
    ("claude-3-7-sonnet", 3.0, 15.0, 0.3, 64_000),
    ("claude-haiku-4-5", 1.0, 5.0, 0.1, 64_000),
    ("claude-3-5-haiku", 0.8, 4.0, 0.08, 8_192),
    ("claude-3-haiku", 0.25, 1.25, 0.03, 4_096),
];

/// The prices a run reads: durun.toml's `[prices]` over the built-in
/// table.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Prices {
    pub(crate) overrides: BTreeMap<String, Price>,
}

impl Prices {
    /// `model`'s price: its own in durun.toml, else the built-in one of
    /// its name or its longest listed prefix (`claude-sonnet-4-5-20250929`
    /// is `claude-sonnet-4-5`), else none.
    pub(crate) fn of(&self, model: &str) -> Option<Price> {
        if let Some(price) = self.overrides.get(model) {
            return Some(*price);
        }
        BUILT_IN
            .iter()
            .filter(|(name, ..)| {
                model == *name
                    || model
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with('-'))
            })
            .max_by_key(|(name, ..)| name.len())
            .map(|(_, input, output, cached, max_output)| Price {
                max_output: Some(*max_output),
                ..Price::per_million(*input, *output, Some(*cached))
            })
    }

    /// The most output tokens one call to `model` may get: its
    /// `max_output` in durun.toml, else the built-in table's.
    pub(crate) fn max_output(&self, model: &str) -> Option<u64> {
        self.overrides
            .get(model)
            .and_then(|price| price.max_output)
            .or_else(|| {
                let built_in = Self::default();
                built_in.of(model).and_then(|price| price.max_output)
            })
    }

    /// What a call to `model` that reported `usage` cost, in nano-dollars;
    /// `None` when the model has no price.
    pub(crate) fn cost(&self, model: &str, usage: &Value) -> Option<u64> {
        self.of(model).map(|price| cost(&price, usage))
    }
}

/// `usage` at `price`: OpenAI's (`prompt_tokens` or `input_tokens` with
/// their cached part in `…_details.cached_tokens`) and Anthropic's
/// (`input_tokens` beside `cache_read_input_tokens` and
/// `cache_creation_input_tokens`, the latter at 1.25 times input).
pub(crate) fn cost(price: &Price, usage: &Value) -> u64 {
    let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    let output = count("/output_tokens").max(count("/completion_tokens"));
    let (fresh, cached, written) = if usage.get("cache_read_input_tokens").is_some()
        || usage.get("cache_creation_input_tokens").is_some()
    {
        (
            count("/input_tokens"),
            count("/cache_read_input_tokens"),
            count("/cache_creation_input_tokens"),
        )
    } else {
        let input = count("/input_tokens").max(count("/prompt_tokens"));
        let cached = count("/input_tokens_details/cached_tokens")
            .max(count("/prompt_tokens_details/cached_tokens"))
            .min(input);
        (input - cached, cached, 0)
    };
    fresh * price.input
        + cached * price.cached_input
        + written * price.input * 5 / 4
        + output * price.output
}

/// Dollars (a budget, a raise) as nano-dollars; `None` for what is not
/// a number of dollars from 0 to a billion.
pub(crate) fn nanos_of_usd(usd: f64) -> Option<u64> {
    // In range, the cast loses at most the rounding to a nano-dollar.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (usd.is_finite() && (0.0..=1e9).contains(&usd)).then(|| (usd * 1e9).round() as u64)
}

/// Nano-dollars as dollars, for JSON.
#[allow(clippy::cast_precision_loss)]
pub(crate) fn usd(nanos: u64) -> f64 {
    nanos as f64 / 1e9
}

/// Nano-dollars for a person: `$0.0123`, `$12.34`, `<$0.0001`.
pub(crate) fn shown(nanos: u64) -> String {
    let dollars = usd(nanos);
    if nanos == 0 {
        "$0".to_owned()
    } else if dollars < 0.0001 {
        "<$0.0001".to_owned()
    } else if dollars < 1.0 {
        format!("${dollars:.4}")
    } else {
        format!("${dollars:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_dated_model_id_takes_its_longest_listed_prefix() {
        let prices = Prices::default();
        assert_eq!(
            prices.of("gpt-4o-2024-08-06"),
            Some(Price {
                max_output: Some(16_384),
                ..Price::per_million(2.5, 10.0, Some(1.25))
            })
        );
        assert_eq!(prices.max_output("gpt-4o-2024-08-06"), Some(16_384));
        assert_eq!(prices.of("gpt-4o-mini-2024-07-18").unwrap().input, 150);
        assert_eq!(
            prices.of("claude-sonnet-4-5-20250929").unwrap().output,
            15_000
        );
        assert_eq!(prices.of("gpt-5.4-nano").unwrap().input, 200);
        assert!(prices.of("gpt-4obis").is_none());
        assert!(prices.of("my-local-llama").is_none());
        let mut overrides = BTreeMap::new();
        overrides.insert(
            "my-local-llama".to_owned(),
            Price::per_million(0.0, 0.0, None),
        );
        overrides.insert("gpt-4o".to_owned(), Price::per_million(1.0, 2.0, None));
        let prices = Prices { overrides };
        assert_eq!(prices.of("my-local-llama").unwrap().output, 0);
        assert_eq!(prices.of("gpt-4o").unwrap().cached_input, 1000);
        // An override names one model; a dated id still reads the table.
        assert_eq!(prices.of("gpt-4o-2024-08-06").unwrap().input, 2500);
    }

    #[test]
    fn usage_is_read_at_its_price_in_every_shape() {
        let price = Price::per_million(2.5, 10.0, Some(1.25));
        // OpenAI chat: 1,000 in (200 of them cached), 100 out.
        let chat = json!({"prompt_tokens": 1000, "completion_tokens": 100,
                          "prompt_tokens_details": {"cached_tokens": 200}});
        assert_eq!(cost(&price, &chat), 800 * 2500 + 200 * 1250 + 100 * 10_000);
        let responses = json!({"input_tokens": 1000, "output_tokens": 100,
                               "input_tokens_details": {"cached_tokens": 200}});
        assert_eq!(cost(&price, &responses), cost(&price, &chat));
        // Anthropic: input excludes the cache; writes cost 1.25 × input.
        let anthropic = json!({"input_tokens": 800, "cache_read_input_tokens": 200,
                               "cache_creation_input_tokens": 40, "output_tokens": 100});
        assert_eq!(
            cost(&price, &anthropic),
            800 * 2500 + 200 * 1250 + 40 * 3125 + 100 * 10_000
        );
        assert_eq!(cost(&price, &json!({})), 0);
        assert!((usd(3_250_000) - 0.003_25).abs() < 1e-15);
        assert_eq!(shown(3_260_000), "$0.0033");
        assert_eq!(shown(12_340_000_000), "$12.34");
        assert_eq!(shown(50), "<$0.0001");
    }
}
