// Replays answered here: the recorded steps durun offers ahead (`ahead`),
// each given back when the agent begins it under the same name and key,
// and durun told which were used (`replayed`) before the agent's next
// request. A replayed step then costs no round trip to durun.

import { idempotencyKey } from "./keys.js";

export class Ahead {
  constructor(task) {
    this.task = task;
    this.steps = [];
    this.at = 0;
    // The last step answered here and not yet told: [number, key].
    this.unsaid = null;
    // An `ahead` is on its way, unanswered.
    this.asked = false;
    // The step number the agent was at when durun last offered nothing:
    // not asked again until it moves on.
    this.emptyAt = -1;
    // durun does not know `ahead` (an older durun): never asked again.
    this.off = false;
  }

  /** Whether an offered step is left past `lastStep`. */
  left(lastStep) {
    while (this.at < this.steps.length && this.steps[this.at].step <= lastStep) this.at++;
    return this.at < this.steps.length;
  }

  /** Takes durun's answer to `ahead`. */
  offered(answer, lastStep) {
    this.asked = false;
    if (!answer.ok || !Array.isArray(answer.steps)) {
      this.off = true;
      return;
    }
    this.steps = answer.steps;
    this.at = 0;
    if (this.steps.length === 0) this.emptyAt = lastStep;
  }

  /** The next offered step, if it is this one: the same name, and the key
   * SPEC 3.1 derives from the args (the rule durun replays by). Else none
   * is used again: durun answers the step, replay or divergence, as it
   * always did. */
  take(name, args) {
    const recorded = this.steps[this.at];
    let key = null;
    try {
      key = idempotencyKey(this.task, recorded.step, args);
    } catch {
      // durun words the refusal.
    }
    if (recorded.name !== name || recorded.idempotency_key !== key) {
      this.steps = [];
      this.at = 0;
      return null;
    }
    this.at++;
    this.unsaid = [recorded.step, key];
    return recorded;
  }

  /** The `replayed` request for the steps used since the last one, if
   * any: it must reach durun before any other request. */
  notice() {
    if (this.unsaid === null) return null;
    const [through, key] = this.unsaid;
    this.unsaid = null;
    return { op: "replayed", through, idempotency_key: key };
  }
}
