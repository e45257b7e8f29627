// PlotlyView: one plotly figure, drawn with Plotly.react into the same <div> every time the kernel sends a new
// `figure` (data, layout, config as JSON) with a new `revision`: a change updates the plot in place instead of
// building a new one. plotly.js is loaded once per page: in JupyterLab, the copy its plotly renderer extension
// has already loaded; elsewhere the first model on the page asks its kernel, which sends plotly.min.js (the copy
// the plotly package ships) as one binary buffer. After each drawing, one frame later, the view tells the
// kernel which revision is on screen ({event: "drawn", revision}).

const PAGE_STYLE_ID = "rtk-plotly-view-style";
const PAGE_STYLE =
  "@keyframes rtk-spin{to{transform:rotate(360deg)}}" +
  ".rtk-plotly-waiting{color:#6b7280;font-size:13px;padding:24px}";

function addPageStyle() {
  if (document.getElementById(PAGE_STYLE_ID)) return;
  const style = document.createElement("style");
  style.id = PAGE_STYLE_ID;
  style.textContent = PAGE_STYLE;
  document.head.appendChild(style);
}

// plotly.min.js from the kernel, as a Blob: asked for once per page by the first model (see `initialize`).
function plotlySource(model) {
  if (!globalThis.__rtkPlotlySource) {
    const source = new Promise((resolve) => {
      const onMessage = (message, buffers) => {
        if (!message || message.event !== "plotly-js") return;
        model.off("msg:custom", onMessage);
        resolve(new Blob(buffers, { type: "text/javascript" }));
      };
      model.on("msg:custom", onMessage);
      model.send({ event: "plotly-js?" });
    });
    source.catch(() => { if (globalThis.__rtkPlotlySource === source) globalThis.__rtkPlotlySource = null; });
    globalThis.__rtkPlotlySource = source;
  }
  return globalThis.__rtkPlotlySource;
}

function runScript(blob) {
  return new Promise((resolve, reject) => {
    const url = URL.createObjectURL(blob);
    const script = document.createElement("script");
    script.onload = () => {
      URL.revokeObjectURL(url);
      if (window.Plotly) resolve(window.Plotly);
      else reject(new Error("plotly.min.js from the kernel ran but set no window.Plotly"));
    };
    script.onerror = () => reject(new Error("plotly.min.js from the kernel did not load"));
    script.src = url;
    document.head.appendChild(script);
  });
}

// JupyterLab's plotly renderer (the jupyterlab-plotly extension) has plotly.js in a chunk that Lab loads and
// compiles when the page starts; the renderer runs it for its first figure. Drawing an empty figure off the page
// has it do so now, which is faster than compiling a second copy. null where the extension is not there.
async function plotlyFromJupyterLab() {
  const container = globalThis._JUPYTERLAB && globalThis._JUPYTERLAB["jupyterlab-plotly"];
  if (!container) return null;
  const { RenderedPlotly, MIME_TYPE } = (await container.get("./mimeExtension"))();
  if (!RenderedPlotly || !MIME_TYPE) return null;
  if (!RenderedPlotly.Plotly) {
    const renderer = new RenderedPlotly({ mimeType: MIME_TYPE });
    await renderer.renderModel({ data: { [MIME_TYPE]: { data: [], layout: {} } }, metadata: {}, setData() {} });
    renderer.dispose();
  }
  return RenderedPlotly.Plotly || window.Plotly || null;
}

function hasJupyterLabPlotly() {
  return Boolean(globalThis._JUPYTERLAB && globalThis._JUPYTERLAB["jupyterlab-plotly"]);
}

async function plotlyFromLabOrKernel(model) {
  try {
    const plotly = await plotlyFromJupyterLab();
    if (plotly) {
      globalThis.__rtkPlotlyFrom = "jupyterlab";  // where this page's plotly.js came from (the browser tests check)
      return plotly;
    }
  } catch (error) {
    console.warn("PlotlyView: JupyterLab's plotly.js did not load; asking the kernel for plotly.min.js", error);
  }
  const plotly = await runScript(await plotlySource(model));
  globalThis.__rtkPlotlyFrom = "kernel";
  return plotly;
}

// anywidget gives each model 2 s from its creation to import its module and initialize; a model that misses it is
// rejected ("[anywidget] Failed to initialize model.") and the kernel's later messages to it are dropped. Compiling
// plotly.js is one main-thread task of 1-3 s on a busy machine: started while other models of the page are still
// importing their modules, it makes them miss that. So the page's first plotly load waits until every rectoolkit
// model its widget manager holds has initialized (each counts itself: countInitialized), for at most INIT_WAIT_MS.
const INIT_WAIT_MS = 2000;
const INIT_POLL_MS = 25;

function countInitialized(model) {
  const counts = (globalThis.__rtkInitialized ??= new WeakMap());  // widget manager -> rectoolkit models initialized
  if (model.widget_manager) counts.set(model.widget_manager, (counts.get(model.widget_manager) || 0) + 1);
}

// How many rectoolkit models of this widget manager have not initialized yet (0 where the manager does not list its
// models: @jupyter-widgets/base keeps them in `_models`, model id -> Promise of the model).
async function modelsInitializing(manager) {
  const promises = manager && manager._models;
  if (!promises) return 0;
  const models = await Promise.all(Object.values(promises).map((p) => Promise.resolve(p).catch(() => null)));
  const ours = models.filter((m) => m && String(m.get("_anywidget_id") || "").startsWith("rectoolkit.")).length;
  return ours - ((globalThis.__rtkInitialized && globalThis.__rtkInitialized.get(manager)) || 0);
}

async function afterModelsInitialized(model) {
  const started = performance.now();
  let waiting = await modelsInitializing(model.widget_manager);
  while (waiting > 0 && performance.now() - started < INIT_WAIT_MS) {
    await new Promise((resolve) => setTimeout(resolve, INIT_POLL_MS));
    waiting = await modelsInitializing(model.widget_manager);
  }
  await new Promise((resolve) => setTimeout(resolve, 0));  // a model is ready just after its initialize returns
  // for the browser tests: how many were still initializing when plotly.js was loaded, and after how long
  globalThis.__rtkPlotlyLoadWait = { waiting, ms: performance.now() - started };
}

function loadPlotly(model) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!globalThis.__rtkPlotlyLoading) {  // once per page, whichever view draws first
    const loading = afterModelsInitialized(model).then(() => plotlyFromLabOrKernel(model));
    loading.catch(() => { globalThis.__rtkPlotlyLoading = null; });  // the next drawing tries again
    globalThis.__rtkPlotlyLoading = loading;
  }
  return globalThis.__rtkPlotlyLoading;
}

// Without JupyterLab's copy: start fetching plotly.js from the kernel as soon as the page has the first figure's
// model (before any view of it, e.g. while the explorer holds its figures back for its first paint); it is run
// (a 5 MB compile) only when a view draws.
function initialize({ model }) {
  if (!window.Plotly && !hasJupyterLabPlotly()) plotlySource(model);
  countInitialized(model);
}

function render({ model, el }) {
  addPageStyle();
  const waiting = document.createElement("div");
  waiting.className = "rtk-plotly-waiting";
  waiting.textContent = "drawing the figure ...";
  const plot = document.createElement("div");
  plot.className = "rtk-plotly-view";
  el.append(waiting, plot);

  let Plotly = null;
  let shown = 0;  // the revision on screen
  let queue = Promise.resolve();
  const draw = () => {
    queue = queue.then(async () => {
      const revision = model.get("revision");
      if (revision === shown) return;  // several changes came while drawing: the latest is drawn once
      Plotly = await loadPlotly(model);
      // a copy: plotly.js writes into the objects it draws, and the model's state must stay as the kernel sent it
      const { data, layout, config } = structuredClone(model.get("figure"));
      await Plotly.react(plot, data, layout, config);
      shown = revision;
      waiting.remove();
      requestAnimationFrame(() => setTimeout(() => model.send({ event: "drawn", revision }), 0));
    }).catch((error) => {
      waiting.textContent = `the figure could not be drawn: ${error}`;
      el.prepend(waiting);
      console.error("PlotlyView", error);
    });
  };
  // A figure drawn while its tab was hidden (or before the view was on the page) has plotly's default width:
  // fit it to its box once the box has a size.
  const resized = new ResizeObserver(() => {
    const width = plot.clientWidth;
    if (Plotly && shown && width > 0 && !(plot.layout && plot.layout.width) && plot._fullLayout
        && plot._fullLayout.width !== width) {
      Plotly.Plots.resize(plot);
    }
  });
  resized.observe(plot);
  model.on("change:revision", draw);
  draw();
  return () => {
    model.off("change:revision", draw);
    resized.disconnect();
    if (Plotly) Plotly.purge(plot);
  };
}

export default { initialize, render };
