// PlotlyView: one plotly figure, drawn with Plotly.react into the same <div> every time the kernel sends a new
// `figure` (data, layout, config as JSON) with a new `revision`: a change updates the plot in place instead of
// building a new one. plotly.js is loaded once per page: JupyterLab's plotly renderer leaves it in window.Plotly
// once it has drawn a figure; otherwise the first view asks its kernel, which sends plotly.min.js (the copy the
// plotly package ships) as one binary buffer. After each drawing, one frame later, the view tells the kernel
// which revision is on screen ({event: "drawn", revision}).

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

function plotlyFromKernel(model) {
  return new Promise((resolve, reject) => {
    const onMessage = (message, buffers) => {
      if (!message || message.event !== "plotly-js") return;
      model.off("msg:custom", onMessage);
      const url = URL.createObjectURL(new Blob(buffers, { type: "text/javascript" }));
      const script = document.createElement("script");
      script.onload = () => {
        URL.revokeObjectURL(url);
        if (window.Plotly) resolve(window.Plotly);
        else reject(new Error("plotly.min.js from the kernel ran but set no window.Plotly"));
      };
      script.onerror = () => reject(new Error("plotly.min.js from the kernel did not load"));
      script.src = url;
      document.head.appendChild(script);
    };
    model.on("msg:custom", onMessage);
    model.send({ event: "plotly-js?" });
  });
}

function loadPlotly(model) {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!globalThis.__rtkPlotlyLoading) {  // once per page, whichever view asks first
    const loading = plotlyFromKernel(model);
    loading.catch(() => { globalThis.__rtkPlotlyLoading = null; });  // the next view asks again
    globalThis.__rtkPlotlyLoading = loading;
  }
  return globalThis.__rtkPlotlyLoading;
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

export default { render };
