// The lecture page around a dashboard (included by index.html.j2; no network, no libraries).
// - While the cells run: the section being computed, a progress bar and the time so far,
//   instead of Voila's "Executing x of y".
// - A bar: the chapter selector, the presentation view, the keys.
// - Keys: Left/Right step the selected control, Up/Down select a control, n/p (PageDown/PageUp)
//   switch demos, r resets the demo, f toggles the presentation view, [ and ] switch chapters.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("course-lecture-data").textContent);
  const sections = data.sections || [];
  const started = Date.now();
  let done = 0;

  // --- progress while Voila runs the cells -------------------------------------------------
  function progressBox() {
    let box = document.getElementById("course-progress");
    const loading = document.getElementById("loading");
    if (!box && loading) {
      box = document.createElement("div");
      box.id = "course-progress";
      box.innerHTML = '<div>Preparing the demos: <span class="course-section"></span></div>' +
        '<progress max="1" value="0"></progress><div class="course-step"></div>';
      const text = document.getElementById("loading_text");
      if (text) text.style.display = "none";
      loading.appendChild(box);
    }
    return box;
  }

  function showProgress() {
    const box = progressBox();
    if (!box) return;
    const count = Math.max(sections.length, 1);
    const section = sections[Math.min(done, sections.length - 1)] || "running";
    box.querySelector(".course-section").textContent = section;
    const bar = box.querySelector("progress");
    bar.max = count;
    bar.value = done;
    const seconds = Math.round((Date.now() - started) / 1000);
    box.querySelector(".course-step").textContent =
      `${Math.round(100 * done / count)}% done, ${seconds} s so far`;
  }

  // Voila calls this after each cell it ran (index counts from 1).
  window.voila_process = function (index, count) {
    done = index;
    showProgress();
  };
  const ticker = setInterval(() => {
    if (!document.getElementById("loading")) { clearInterval(ticker); return; }
    showProgress();
  }, 1000);

  // --- the bar -------------------------------------------------------------------------------
  const KEYS = "\u2190 \u2192 step \u00b7 \u2191 \u2193 control \u00b7 n / p demo \u00b7 r reset \u00b7 " +
    "f presentation \u00b7 [ ] chapter";

  function buildBar() {
    const bar = document.createElement("div");
    bar.id = "course-bar";
    const home = document.createElement("a");
    home.href = data.base;
    home.textContent = "all chapters";
    const label = document.createElement("label");
    label.textContent = "chapter ";
    const select = document.createElement("select");
    select.id = "course-chapter";
    for (const [id, title] of data.chapters) {
      const option = document.createElement("option");
      option.value = id;
      option.textContent = `${id.slice(0, 4)}  ${title}`;
      option.selected = id === data.chapter;
      select.appendChild(option);
    }
    select.addEventListener("change", () => openChapter(select.value));
    label.appendChild(select);
    const present = document.createElement("button");
    present.id = "course-present";
    present.textContent = "presentation view (f)";
    present.addEventListener("click", () => togglePresentation());
    const keys = document.createElement("span");
    keys.className = "course-keys";
    keys.textContent = KEYS;
    bar.append(home, label, present, keys);
    document.body.prepend(bar);
  }

  function openChapter(id) {
    if (id && id !== data.chapter) window.location.href = `${data.base}voila/render/${id}.ipynb`;
  }

  function stepChapter(direction) {
    const ids = data.chapters.map((c) => c[0]);
    const next = ids[ids.indexOf(data.chapter) + direction];
    openChapter(next);
  }

  // --- demos and controls --------------------------------------------------------------------
  let current = 0;   // the demo shown / steered by the keys
  let selected = 0;  // its control the arrows move

  const demos = () => Array.from(document.querySelectorAll(".jp-Cell.celltag_demo"));
  const controlsOf = (demo) => demo ? Array.from(demo.querySelectorAll(".widget-slider, .widget-dropdown")) : [];
  const rowOf = (control) => control.closest(".course-control") || control;

  function mark() {
    const all = demos();
    if (!all.length) return;
    current = Math.min(current, all.length - 1);
    document.querySelectorAll(".course-current").forEach((el) => el.classList.remove("course-current"));
    const demo = all[current];
    demo.classList.add("course-current");
    // Voila wraps each cell in a <div cell-index>: the demo's heading is the wrapper before.
    const wrapper = demo.closest("[cell-index]");
    const previous = wrapper && wrapper.previousElementSibling;
    const intro = previous && previous.querySelector(".jp-MarkdownCell");
    if (intro) intro.classList.add("course-current");
    const controls = controlsOf(demo);
    selected = Math.min(selected, Math.max(controls.length - 1, 0));
    document.querySelectorAll(".course-selected").forEach((el) => el.classList.remove("course-selected"));
    if (controls.length) rowOf(controls[selected]).classList.add("course-selected");
    document.body.dataset.courseDemo = String(current);
    document.body.dataset.courseControl = String(selected);
  }

  function showDemo(index) {
    const all = demos();
    if (!all.length) return;
    current = (index + all.length) % all.length;
    selected = 0;
    mark();
    all[current].scrollIntoView({block: "start"});
  }

  function selectControl(direction) {
    const controls = controlsOf(demos()[current]);
    if (!controls.length) return;
    selected = (selected + direction + controls.length) % controls.length;
    // The arrows now go to the newly selected control, not to a slider handle focused before.
    const active = document.activeElement;
    if (active && active.closest && active.closest(".celltag_demo")) active.blur();
    mark();
  }

  function step(direction) {
    const control = controlsOf(demos()[current])[selected];
    if (!control) return;
    const select = control.querySelector("select");
    if (select) {
      const index = Math.min(Math.max(select.selectedIndex + direction, 0), select.options.length - 1);
      if (index !== select.selectedIndex) {
        select.selectedIndex = index;
        select.dispatchEvent(new Event("change", {bubbles: true}));
      }
      return;
    }
    const handle = control.querySelector(".noUi-handle");
    if (handle) {
      handle.focus({preventScroll: true});
      handle.dispatchEvent(new KeyboardEvent("keydown", {
        key: direction > 0 ? "ArrowRight" : "ArrowLeft", bubbles: true, cancelable: true}));
    }
  }

  function reset() {
    const demo = demos()[current];
    const button = demo && demo.querySelector(".course-reset button, button.course-reset");
    if (button) button.click();
  }

  function togglePresentation(on) {
    const body = document.body;
    const want = on === undefined ? !body.classList.contains("course-present") : on;
    body.classList.toggle("course-present", want);
    mark();
    const root = document.documentElement;
    if (want && !document.fullscreenElement && root.requestFullscreen) {
      root.requestFullscreen().catch(() => {});  // refused without a user gesture: the view still applies
    } else if (!want && document.fullscreenElement && document.exitFullscreen) {
      document.exitFullscreen().catch(() => {});
    }
    const all = demos();
    if (all.length) all[current].scrollIntoView({block: "start"});
  }

  document.addEventListener("fullscreenchange", () => {
    if (!document.fullscreenElement) document.body.classList.remove("course-present");  // Esc leaves both
  });

  // In the capture phase, before a focused slider handle sees the key: Up/Down select a control
  // here (noUiSlider would step the slider); Left/Right on a handle stay the slider's own.
  window.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" ||
                   (target.tagName === "SELECT" && target.id !== "course-chapter"))) return;
    const onHandle = target && target.classList && target.classList.contains("noUi-handle");
    const actions = {
      ArrowRight: () => step(+1), ArrowLeft: () => step(-1),
      ArrowDown: () => selectControl(+1), ArrowUp: () => selectControl(-1),
      n: () => showDemo(current + 1), PageDown: () => showDemo(current + 1),
      p: () => showDemo(current - 1), PageUp: () => showDemo(current - 1),
      r: reset, f: () => togglePresentation(),
      "[": () => stepChapter(-1), "]": () => stepChapter(+1),
    };
    const selectedControl = controlsOf(demos()[current])[selected];
    if (onHandle && (event.key === "ArrowRight" || event.key === "ArrowLeft") &&
        selectedControl && selectedControl.contains(target)) return;  // the selected slider's own
    if (target && target.id === "course-chapter" && event.key.startsWith("Arrow")) return;
    const action = actions[event.key];
    if (!action) return;
    event.preventDefault();
    event.stopPropagation();
    action();
  }, true);

  // A click or focus inside a demo makes it (and that control) the one the keys steer.
  document.addEventListener("focusin", (event) => {
    const demo = event.target.closest && event.target.closest(".jp-Cell.celltag_demo");
    if (!demo) return;
    current = demos().indexOf(demo);
    const index = controlsOf(demo).findIndex((c) => c.contains(event.target));
    if (index >= 0) selected = index;
    mark();
  });

  function ready() {
    buildBar();
    showProgress();
    // Widgets render after the cells: mark the current demo and control once they are there.
    const marker = setInterval(() => {
      if (!document.getElementById("loading") && controlsOf(demos()[current]).length) {
        mark();
        clearInterval(marker);
      }
    }, 300);
  }

  if (document.body) ready();
  else document.addEventListener("DOMContentLoaded", ready);
})();
