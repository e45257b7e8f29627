// PaintProbe: tells the kernel once its view is on the page and the browser has painted it, so that a
// widget can send what is slow to draw (the page's first plotly figure loads plotly.js) after it is visible.

// Counted among the page's rectoolkit models that have initialized (see plotly_view.js: the first plotly.js load
// waits for them).
function initialize({ model }) {
  const counts = (globalThis.__rtkInitialized ??= new WeakMap());
  if (model.widget_manager) counts.set(model.widget_manager, (counts.get(model.widget_manager) || 0) + 1);
}

function render({ model }) {
  requestAnimationFrame(() => setTimeout(() => model.send({ event: "painted" }), 0));
}

export default { initialize, render };
