//! The queries of budgets shared by a tree of tasks (SPEC 16, 19): what
//! the tree spent, and what its model calls in flight may spend at worst.

use super::{NOW_MS, Sql};

/// Task `$1`'s budgets, its row locked while a call reserves against them.
pub(crate) static BUDGET_OF: Sql =
    Sql::new("SELECT max_tokens, max_cost_nanos FROM tasks WHERE id = $1 FOR UPDATE");

/// Whether task id `TASK` is `$1` or one of its descendants (`$1-sN…`).
const IN_TREE: &str = "(TASK = $1 OR substr(TASK, 1, length($1) + 2) = $1 || '-s')";

/// What task `$1` and its descendants spent, in tokens and nano-dollars:
/// their runs' counters, written with each finished step.
pub(crate) static TREE_SPENT: Sql = Sql::made(|| {
    format!(
        "SELECT CAST(coalesce(sum(tokens_spent), 0) AS BIGINT),
                CAST(coalesce(sum(cost_spent_nanos), 0) AS BIGINT)
         FROM runs WHERE {}",
        IN_TREE.replace("TASK", "task_id")
    )
});

/// Drops the holds in task `$1`'s tree that no longer hold: their step
/// finished in their run (what it spent is in the run's counters, written
/// in the same transaction; a request numbered when its answer is written
/// is known by its args' hash: the `nth` call of a hash is done once more
/// than `nth` steps of that hash finished), or their run no longer holds
/// its task's lease (it ended, or its heartbeat is older than `$2` ms).
pub(crate) static TREE_HOLDS_DROP: Sql = Sql::made(|| {
    format!(
        "DELETE FROM budget_holds WHERE {} AND (
             (budget_holds.step_index > 0 AND EXISTS (
                 SELECT 1 FROM steps s WHERE s.task_id = budget_holds.task_id
                     AND s.step_index = budget_holds.step_index AND s.run = budget_holds.run
                     AND s.status IN ('committed', 'failed')))
             OR (budget_holds.step_index = 0 AND (
                 SELECT count(*) FROM steps s WHERE s.task_id = budget_holds.task_id
                     AND s.run = budget_holds.run AND s.args_hash = budget_holds.args_hash
                     AND s.status IN ('committed', 'failed')) > budget_holds.nth)
             OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = budget_holds.task_id
                         AND t.lease_run = budget_holds.run AND t.lease_heartbeat >= {NOW_MS} - $2))",
        IN_TREE.replace("TASK", "budget_holds.task_id")
    )
});

/// What the holds in task `$1`'s tree may spend at worst, and how many.
pub(crate) static TREE_HELD: Sql = Sql::made(|| {
    format!(
        "SELECT CAST(coalesce(sum(tokens), 0) AS BIGINT), CAST(coalesce(sum(nanos), 0) AS BIGINT),
                count(*)
         FROM budget_holds WHERE {}",
        IN_TREE.replace("TASK", "task_id")
    )
});

/// A model call of step `$3` of run `$2` of task `$1` (or its `$5`th call
/// of args hash `$4`) holds `$6` tokens and `$7` nano-dollars.
pub(crate) static BUDGET_HOLD: Sql = Sql::new(
    "INSERT INTO budget_holds (task_id, run, step_index, args_hash, nth, tokens, nanos)
     VALUES ($1, $2, $3, $4, $5, $6, $7)",
);
