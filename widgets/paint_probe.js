// PaintProbe: tells the kernel once its view is on the page and the browser has painted it, so that a
// widget can send what is slow to draw (the page's first plotly figure loads plotly.js) after it is visible.

function render({ model }) {
  requestAnimationFrame(() => setTimeout(() => model.send({ event: "painted" }), 0));
}

export default { render };
