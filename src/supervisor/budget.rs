//! A run's budget (SPEC 9 and 19): the task's limits in tokens and in
//! nano-dollars, what the task (with its children) had spent before this
//! run, what this run's finished steps spent, and the worst case of each
//! model call in flight. A call is forwarded only when its worst case
//! fits beside the others': spent never passes a budget, however many
//! calls run at once.

use std::collections::BTreeMap;

use crate::prices::{Prices, shown};
use crate::report::thousands;
use crate::usage::Asked;

/// What a call may spend at worst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Worst {
    pub(crate) tokens: u64,
    pub(crate) nanos: u64,
}

/// Whether a call's worst case fits.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fit {
    /// Reserved, under this number: release it when the call ends.
    Reserved(u64),
    /// Not beside the calls in flight: after one of them ends, maybe.
    Later,
    /// Never: the budget is spent, or the call alone is larger than what
    /// is left (why, for the user).
    Never(String),
}

#[derive(Debug, Default)]
pub(crate) struct Budget {
    max_tokens: Option<u64>,
    max_nanos: Option<u64>,
    /// Spent by the task and its children before this run.
    before: Worst,
    /// Spent by this run's finished steps, written or not.
    spent: Worst,
    reserved: BTreeMap<u64, Worst>,
    next: u64,
}

impl Budget {
    pub(crate) fn new(max_tokens: Option<u64>, max_nanos: Option<u64>, before: Worst) -> Self {
        Self {
            max_tokens,
            max_nanos,
            before,
            ..Self::default()
        }
    }

    /// The task's budgets as the journal has them now (`durun approve`
    /// raised them); whether either changed.
    pub(crate) fn raise(&mut self, max_tokens: Option<u64>, max_nanos: Option<u64>) -> bool {
        let changed = (max_tokens, max_nanos) != (self.max_tokens, self.max_nanos);
        self.max_tokens = max_tokens;
        self.max_nanos = max_nanos;
        changed
    }

    /// Whether any budget holds the run.
    pub(crate) fn limited(&self) -> bool {
        self.max_tokens.is_some() || self.max_nanos.is_some()
    }

    /// What the task has spent, this run's finished steps included.
    pub(crate) fn spent(&self) -> Worst {
        Worst {
            tokens: self.before.tokens + self.spent.tokens,
            nanos: self.before.nanos + self.spent.nanos,
        }
    }

    /// A step finished, with what it spent.
    pub(crate) fn add(&mut self, tokens: u64, nanos: Option<u64>) {
        self.spent.tokens += tokens;
        self.spent.nanos += nanos.unwrap_or(0);
    }

    /// Why the task may open no new step, once spent has reached a budget.
    pub(crate) fn spent_out(&self) -> Option<String> {
        let spent = self.spent();
        if let Some(max) = self.max_tokens.filter(|max| spent.tokens >= *max) {
            return Some(format!(
                "spent {} of its {} tokens",
                thousands(spent.tokens),
                thousands(max)
            ));
        }
        self.max_nanos
            .filter(|max| spent.nanos >= *max)
            .map(|max| format!("spent {} of its {}", shown(spent.nanos), shown(max)))
    }

    /// The worst case of a call that asked `asked`, at `prices`; why it
    /// has none, when a budget needs one.
    pub(crate) fn worst_of(&self, asked: &Asked, prices: &Prices) -> Result<Worst, String> {
        let model = &asked.model;
        let output = asked
            .output_cap
            .or_else(|| prices.max_output(model))
            .ok_or_else(|| {
                format!(
                    "a call to model {model} sets no max_tokens and durun knows no output limit of {model}, so it cannot keep the call within the task's budget: set max_tokens in the request, or `max_output` in [prices.\"{model}\"] of durun.toml"
                )
            })?;
        let tokens = asked.input + output;
        let nanos = if self.max_nanos.is_some() {
            let price = prices.of(model).ok_or_else(|| {
                format!(
                    "model {model} has no price, so durun cannot keep its calls within the task's budget in dollars: give it one in [prices.\"{model}\"] of durun.toml"
                )
            })?;
            asked.input * price.input + output * price.output
        } else {
            0
        };
        Ok(Worst { tokens, nanos })
    }

    /// Reserves `worst` if it fits beside what is spent and reserved.
    pub(crate) fn reserve(&mut self, worst: Worst) -> Fit {
        let spent = self.spent();
        let reserved = self
            .reserved
            .values()
            .fold(Worst::default(), |sum, one| Worst {
                tokens: sum.tokens + one.tokens,
                nanos: sum.nanos + one.nanos,
            });
        let tokens = self
            .max_tokens
            .filter(|max| spent.tokens + reserved.tokens + worst.tokens > *max)
            .map(|max| {
                format!(
                    "spent {} of its {} tokens, and a model call that may take {} more does not fit",
                    thousands(spent.tokens),
                    thousands(max),
                    thousands(worst.tokens)
                )
            });
        let nanos = self
            .max_nanos
            .filter(|max| spent.nanos + reserved.nanos + worst.nanos > *max)
            .map(|max| {
                format!(
                    "spent {} of its {}, and a model call that may cost {} more does not fit",
                    shown(spent.nanos),
                    shown(max),
                    shown(worst.nanos)
                )
            });
        match tokens.or(nanos) {
            Some(_) if !self.reserved.is_empty() => Fit::Later,
            Some(why) => Fit::Never(why),
            None => {
                self.next += 1;
                self.reserved.insert(self.next, worst);
                Fit::Reserved(self.next)
            }
        }
    }

    /// A call ended: its reservation goes (what it spent is added when its
    /// step finishes).
    pub(crate) fn release(&mut self, reservation: u64) {
        self.reserved.remove(&reservation);
    }
}

/// Why a call does not fit the budget of `over.task`, which covers the
/// run's task as an ancestor's (or its own, with its children's) does.
pub(crate) fn tree_over(over: &crate::journal::budgets::Over, worst: Worst) -> String {
    let task = &over.task;
    match over.max_tokens {
        Some(max) if over.spent.tokens + worst.tokens > max || over.max_nanos.is_none() => format!(
            "task {task} and its child tasks have spent {} of its {} tokens, and a model call that may take {} more does not fit",
            thousands(over.spent.tokens),
            thousands(max),
            thousands(worst.tokens)
        ),
        _ => format!(
            "task {task} and its child tasks have spent {} of its {}, and a model call that may cost {} more does not fit",
            shown(over.spent.nanos),
            shown(over.max_nanos.unwrap_or(0)),
            shown(worst.nanos)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(tokens: u64) -> Worst {
        Worst { tokens, nanos: 0 }
    }

    /// Calls in flight take their worst case out of the budget; one that
    /// does not fit waits for them, or never runs when none is in flight.
    #[test]
    fn calls_reserve_their_worst_case_and_never_pass_the_budget() {
        let mut budget = Budget::new(Some(1_000), None, tokens(100));
        let Fit::Reserved(first) = budget.reserve(tokens(500)) else {
            panic!("fits");
        };
        assert_eq!(budget.reserve(tokens(500)), Fit::Later);
        assert!(matches!(budget.reserve(tokens(400)), Fit::Reserved(_)));
        budget.release(first);
        budget.add(120, None);
        assert!(matches!(budget.reserve(tokens(300)), Fit::Reserved(_)));
        let mut alone = Budget::new(Some(1_000), None, tokens(900));
        assert!(
            matches!(alone.reserve(tokens(101)), Fit::Never(why) if why.contains("900 of its 1,000"))
        );
        alone.add(100, None);
        assert!(alone.spent_out().is_some());
    }

    /// The worst case is the input bound and the output cap, at the
    /// model's price; without a cap, the model's output limit.
    #[test]
    fn the_worst_case_is_priced_and_needs_an_output_limit() {
        let prices = Prices::default();
        let dollars = Budget::new(None, Some(1_000_000_000), Worst::default());
        let asked = Asked {
            model: "gpt-4o".into(),
            input: 1_000,
            output_cap: Some(500),
        };
        let worst = dollars.worst_of(&asked, &prices).expect("priced");
        assert_eq!(worst.tokens, 1_500);
        assert_eq!(worst.nanos, 1_000 * 2_500 + 500 * 10_000);
        let uncapped = Asked {
            output_cap: None,
            ..asked.clone()
        };
        assert_eq!(
            dollars.worst_of(&uncapped, &prices).expect("known").tokens,
            1_000 + 16_384
        );
        let unknown = Asked {
            model: "m".into(),
            ..asked
        };
        assert!(
            dollars
                .worst_of(&unknown, &prices)
                .is_err_and(|why| why.contains("no price"))
        );
        let token_budget = Budget::new(Some(10), None, Worst::default());
        assert_eq!(
            token_budget
                .worst_of(&unknown, &prices)
                .map(|worst| worst.tokens),
            Ok(1_500)
        );
    }
}
