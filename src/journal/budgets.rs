//! Budgets a tree of tasks shares (SPEC 16, 19). A child task is held to
//! its own budget by its run, as any task is; its ancestors' budgets cover
//! it too, and its siblings may spend at the same time, in other
//! processes. So a run whose task has a budgeted ancestor (or children of
//! its own) reserves each model call's worst case here, against each such
//! budget: what the tree's runs spent, plus what its calls in flight may
//! spend, plus this one, must fit. Written without waiting for the disk: a
//! hold is void once its step finished in its run (what it spent is then
//! in the run's counters, written in the same transaction) or its run no
//! longer holds its task's lease, so a crash loses nothing that counts.

use anyhow::Result;

use super::sql;
use super::tx::Tx;

/// What a call may spend at worst, or a tree spent or holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Amount {
    pub(crate) tokens: u64,
    pub(crate) nanos: u64,
}

/// A call of step `step` of run `run` of task `task`, and its worst case.
#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) task: String,
    pub(crate) run: u32,
    /// 0 for a request numbered when its answer is written: then it is
    /// the run's `nth` call (from 0) of its `args_hash`.
    pub(crate) step: u64,
    pub(crate) args_hash: String,
    pub(crate) nth: u64,
    pub(crate) worst: Amount,
}

/// A budget of the tree that the call does not fit.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Over {
    /// The task whose budget it is.
    pub(crate) task: String,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_nanos: Option<u64>,
    /// What the task and its descendants spent.
    pub(crate) spent: Amount,
    /// Whether calls in flight hold part of the budget: once they end,
    /// the call may fit.
    pub(crate) in_flight: bool,
}

/// Reserves `hold` against the budget of each of `budgeted` (task ids,
/// each with its descendants); the first it does not fit, if any.
pub(crate) fn reserve(
    tx: &mut dyn Tx,
    budgeted: &[String],
    hold: &Hold,
    stale_ms: u64,
) -> Result<Option<Over>> {
    for task in budgeted {
        let Some((max_tokens, max_nanos)) =
            tx.query_opt(&sql::BUDGET_OF, &[task.as_str().into()], |row| {
                let amount = |value: Option<i64>| value.map(|value| value.max(0) as u64);
                Ok((amount(row.int(0)?), amount(row.int(1)?)))
            })?
        else {
            continue;
        };
        if max_tokens.is_none() && max_nanos.is_none() {
            continue;
        }
        tx.execute(
            &sql::TREE_HOLDS_DROP,
            &[task.as_str().into(), stale_ms.into()],
        )?;
        let spent = tx
            .query_opt(&sql::TREE_SPENT, &[task.as_str().into()], |row| {
                Ok(Amount {
                    tokens: row.some_int(0)?.max(0) as u64,
                    nanos: row.some_int(1)?.max(0) as u64,
                })
            })?
            .unwrap_or_default();
        let (held, holds) = tx
            .query_opt(&sql::TREE_HELD, &[task.as_str().into()], |row| {
                Ok((
                    Amount {
                        tokens: row.some_int(0)?.max(0) as u64,
                        nanos: row.some_int(1)?.max(0) as u64,
                    },
                    row.some_int(2)?,
                ))
            })?
            .unwrap_or_default();
        let over = |max: Option<u64>, spent: u64, held: u64, worst: u64| {
            max.is_some_and(|max| spent + held + worst > max)
        };
        if over(max_tokens, spent.tokens, held.tokens, hold.worst.tokens)
            || over(max_nanos, spent.nanos, held.nanos, hold.worst.nanos)
        {
            let alone = over(max_tokens, spent.tokens, 0, hold.worst.tokens)
                || over(max_nanos, spent.nanos, 0, hold.worst.nanos);
            return Ok(Some(Over {
                task: task.clone(),
                max_tokens,
                max_nanos,
                spent,
                in_flight: holds > 0 && !alone,
            }));
        }
    }
    tx.execute(
        &sql::BUDGET_HOLD,
        &[
            hold.task.as_str().into(),
            hold.run.into(),
            hold.step.into(),
            hold.args_hash.as_str().into(),
            hold.nth.into(),
            hold.worst.tokens.into(),
            hold.worst.nanos.into(),
        ],
    )?;
    Ok(None)
}
