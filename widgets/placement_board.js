// PlacementBoard: shards as blocks in rank columns; drag a block (or click it, then click a column)
// to move it to another rank. State lives in the model (anywidget): the Python side owns the plan,
// this module only draws `columns` / `shards` / `message` and sends `move_request`.

function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(bytes);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value.toFixed(0)} B` : `${value.toFixed(2)} ${units[unit]}`;
}

function requestMove(model, shardId, rank) {
  model.set("move_request", { id: shardId, rank: rank, nonce: Date.now() + Math.random() });
  model.save_changes();
}

const REPLICAS_SHOWN_ONE_BY_ONE = 3;

function groupOfReplicas(replicas) {
  const tables = replicas.map((s) => s.table);
  return {
    ...replicas[0],  // picking the group picks its first replica: the kernel refuses the move and says why
    label: `${replicas.length} replicas (data parallel)`,
    tooltip: `data-parallel replicas, one on every rank, they cannot move: ${tables.join(", ")}`,
    height: 18,
    group: true,
  };
}

function shardBlock(model, el, state, shard) {
  const block = document.createElement("div");
  block.className = "rtk-board-shard";
  block.dataset.shard = shard.id;
  block.dataset.table = shard.table;
  block.style.background = shard.color;
  if (shard.text_color) {
    block.style.color = shard.text_color;
    if (shard.text_color !== "#FFFFFF") block.style.textShadow = "none";
  }
  block.style.minHeight = `${shard.height}px`;
  block.title = shard.tooltip;
  // replicas can be picked up too: the kernel refuses the move and says why on the board
  block.draggable = true;
  if (!shard.movable) block.classList.add("rtk-fixed");
  if (shard.group) block.classList.add("rtk-replica-group");
  if (state.selected === shard.id) block.classList.add("rtk-selected");
  block.textContent = shard.label;
  block.addEventListener("dragstart", (event) => {
    event.dataTransfer.setData("text/plain", shard.id);
    event.dataTransfer.effectAllowed = "move";
  });
  block.addEventListener("click", (event) => {
    event.stopPropagation();
    state.selected = state.selected === shard.id ? null : shard.id;
    renderBoard(model, el, state);
  });
  return block;
}

function renderBoard(model, el, state) {
  const columns = model.get("columns") || [];
  const shards = model.get("shards") || [];
  const message = model.get("message") || "";
  const messageKind = model.get("message_kind") || "info";
  el.replaceChildren();

  const root = document.createElement("div");
  root.className = "rtk-board";

  const header = document.createElement("div");
  header.className = "rtk-board-title";
  header.textContent = model.get("title") || "Placement board";
  root.appendChild(header);

  const hint = document.createElement("div");
  hint.className = "rtk-board-hint";
  hint.textContent = model.get("hint") || "";
  root.appendChild(hint);

  // the message (a move done or refused) stands above the columns: below 16+ wrapped ranks it is out of view
  const status = document.createElement("div");
  status.className = `rtk-board-message rtk-${messageKind}`;
  status.textContent = message;
  root.appendChild(status);

  const grid = document.createElement("div");
  grid.className = "rtk-board-grid";
  for (const column of columns) {
    const col = document.createElement("div");
    col.className = "rtk-board-column";
    col.dataset.rank = String(column.rank);
    if (column.over) col.classList.add("rtk-over");

    const head = document.createElement("div");
    head.className = "rtk-board-column-head";
    head.style.borderTopColor = column.color;
    const name = document.createElement("div");
    name.className = "rtk-board-rank";
    name.textContent = column.label;
    head.appendChild(name);
    const meter = document.createElement("div");
    meter.className = "rtk-board-meter";
    const fill = document.createElement("div");
    fill.className = "rtk-board-meter-fill";
    const used = column.capacity > 0 ? Math.min(1, column.bytes / column.capacity) : 0;
    fill.style.width = `${(100 * used).toFixed(1)}%`;
    meter.appendChild(fill);
    head.appendChild(meter);
    const usage = document.createElement("div");
    usage.className = "rtk-board-usage";
    usage.textContent = column.capacity > 0
      ? `${formatBytes(column.bytes)} / ${formatBytes(column.capacity)}`
      : formatBytes(column.bytes);
    head.appendChild(usage);
    head.addEventListener("click", () => {
      if (state.selected !== null) {
        requestMove(model, state.selected, column.rank);
        state.selected = null;
      }
    });
    col.appendChild(head);

    col.addEventListener("dragover", (event) => {
      event.preventDefault();
      col.classList.add("rtk-drop-target");
    });
    col.addEventListener("dragleave", () => col.classList.remove("rtk-drop-target"));
    col.addEventListener("drop", (event) => {
      event.preventDefault();
      col.classList.remove("rtk-drop-target");
      const shardId = event.dataTransfer.getData("text/plain");
      if (shardId) requestMove(model, shardId, column.rank);
    });

    // a column's data-parallel replicas (one of each on every rank) fold into one block past a few: they
    // cannot move, and listed one by one they make every column tall at many ranks
    const own = shards.filter((s) => s.rank === column.rank);
    const replicas = own.filter((s) => !s.movable);
    const blocks = replicas.length > REPLICAS_SHOWN_ONE_BY_ONE
      ? [groupOfReplicas(replicas), ...own.filter((s) => s.movable)]
      : own;
    for (const shard of blocks) {
      col.appendChild(shardBlock(model, el, state, shard));
    }
    grid.appendChild(col);
  }
  root.appendChild(grid);

  el.appendChild(root);
}

// Counted among the page's rectoolkit models that have initialized (see plotly_view.js: the first plotly.js load
// waits for them).
function initialize({ model }) {
  const counts = (globalThis.__rtkInitialized ??= new WeakMap());
  if (model.widget_manager) counts.set(model.widget_manager, (counts.get(model.widget_manager) || 0) + 1);
}

function render({ model, el }) {
  const state = { selected: null };
  const redraw = () => renderBoard(model, el, state);
  for (const name of ["columns", "shards", "message", "message_kind", "title", "hint"]) {
    model.on(`change:${name}`, redraw);
  }
  redraw();
  return () => {
    for (const name of ["columns", "shards", "message", "message_kind", "title", "hint"]) {
      model.off(`change:${name}`, redraw);
    }
  };
}

export default { initialize, render };
