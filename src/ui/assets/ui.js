// durun ui: live updates and actions without a reload. Everything shown
// comes from the server as escaped HTML; this script only moves it, and
// writes messages as text.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;
const said = document.getElementById("said");

function say(message, ok) {
  said.textContent = message;
  said.className = ok ? "ok" : "bad";
  said.hidden = false;
}

// Replaces the page's content with a fresh copy, keeping the folds the
// reader opened.
async function refresh() {
  const response = await fetch(location.href, { headers: { Accept: "text/html" } });
  if (!response.ok) return;
  const fresh = new DOMParser().parseFromString(await response.text(), "text/html").querySelector("main");
  const main = document.querySelector("main");
  if (!fresh || !main) return;
  const open = [...main.querySelectorAll("details")].map((fold) => fold.open);
  const focused = document.activeElement && document.activeElement.name;
  const typed = [...main.querySelectorAll("input")].map((input) => input.value);
  main.replaceChildren(...fresh.childNodes);
  const folds = main.querySelectorAll("details");
  if (folds.length === open.length) folds.forEach((fold, i) => { fold.open = open[i]; });
  const inputs = main.querySelectorAll("input");
  if (inputs.length === typed.length) inputs.forEach((input, i) => { if (input.type !== "hidden") input.value = typed[i]; });
  if (focused) { const again = main.querySelector(`[name="${CSS.escape(focused)}"]`); if (again) again.focus(); }
}

// Asks the server every second whether what the page shows changed.
const key = document.body.dataset.live;
if (key) {
  let seen = null;
  const badge = document.getElementById("live");
  const poll = async () => {
    if (document.visibilityState === "visible") {
      try {
        const response = await fetch(`/api/live?key=${encodeURIComponent(key)}`);
        if (response.ok) {
          const { version } = await response.json();
          badge.hidden = false;
          if (seen !== null && version !== seen) await refresh();
          seen = version;
        } else {
          badge.hidden = true;
        }
      } catch (_) {
        badge.hidden = true;
      }
    }
    setTimeout(poll, 1000);
  };
  poll();
}

document.addEventListener("submit", async (event) => {
  const form = event.target;
  if (!form.classList.contains("act")) return;
  event.preventDefault();
  if (form.action.endsWith("/cancel") && !confirm("Cancel this task for good? Its agent is stopped and it never resumes.")) return;
  const buttons = form.querySelectorAll("button");
  buttons.forEach((button) => { button.disabled = true; });
  try {
    const response = await fetch(form.action, {
      method: "POST",
      headers: { Accept: "application/json", "X-CSRF-Token": csrf, "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(new FormData(form)),
    });
    const answer = await response.json();
    say(answer.message || (answer.ok ? "done" : "not done"), answer.ok);
    if (answer.ok && answer.location && answer.location !== location.pathname) {
      location.assign(answer.location);
    } else {
      await refresh();
    }
  } catch (error) {
    say(`the server did not answer: ${error}`, false);
  } finally {
    buttons.forEach((button) => { button.disabled = false; });
  }
});
