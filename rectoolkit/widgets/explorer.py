"""PlanExplorer: try sharding choices by clicking; every change re-plans and redraws at once.

    from rectoolkit.widgets import PlanExplorer
    explorer = PlanExplorer(rectoolkit.load_workload("dlrm26"), world_size=8)
    explorer                                     # controls, figures, placement board, export
    explorer.set(world_size=4, optimizer="adam") # the same from Python (tests, scripts)
    explorer.plan, explorer.result.memory        # the current plan and report frames

Controls: world size, ranks per host, memory per rank, batch size, optimizer, objective, and per table a
forced sharding type (or auto). Drag shards on the placement board to override the planner. Errors (the
plan does not fit, bad settings) are shown in the widget with the planner's explanation.

This module holds the widget: its controls, events and tabs. The settings it starts from are made in
explorer_settings, the HTML it shows beside its figures (status line, tables, error box, Measure note) in
explorer_html, the planning itself in planning.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import ipywidgets as w
import numpy as np

from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.viz.comm import TOTAL, comm_matrix_traces, comm_options
from rectoolkit.viz.diff import plan_diff_traces
from rectoolkit.viz.measured import measured_vs_estimated_traces
from rectoolkit.viz.frames import plan_diff
from rectoolkit.viz.memory import memory_traces
from rectoolkit.viz.placement import rank_table_traces, shard_placement_traces
from rectoolkit.viz.timing import rank_time_traces
from rectoolkit.widgets import planning
from rectoolkit.widgets.board import PlacementBoard
from rectoolkit.widgets.explorer_html import error_box, forced_label, html_table, measure_note, status_html
from rectoolkit.widgets.explorer_settings import initial_settings
from rectoolkit.widgets.inputs import as_table_set
from rectoolkit.widgets.live_figure import SPINNER, LazyFigure, PaintProbe
from rectoolkit.widgets.planning import (AUTO, ExplorerSettings, PlanningResult, measure_current_and_pinned,
                                         plan_and_report)

WORLD_SIZES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512]
OPTIMIZERS = ["sgd", "row_wise_adagrad", "adagrad", "adam"]
DEVICES = ["cuda", "cpu"]
OBJECTIVES = ["time", "memory", "bytes"]
SHARDING_CHOICES = [AUTO] + [t.value for t in ShardingType]

DEFAULT_WORKDIR = Path.home() / "rectoolkit-work"
_EMPTY_MEMORY_NOTE = "the planner's report has no per-rank memory table"
NO_PLAN_NOTE = "No plan for the settings above (the message at the top says why)."


class PlanExplorer(w.VBox):
    """Interactive sharding planner over your tables (configs, Workload, DataFrame, CSV or nn.Module).

    Args:
        tables: what to plan (see `rectoolkit.widgets.inputs.as_table_set`).
        topology: a planner Topology to start from (world size, ranks per host, memory, batch size).
        world_size, local_world_size, memory_per_rank_gib, batch_size, optimizer, objective: start values.
        forced: table -> sharding type to start with.
        plan_path: the file "Save plan" writes (JSON); a relative path is taken inside `workdir`.
        workdir: the folder for saved files, shown in the Export tab (default: ~/rectoolkit-work, outside any
            repository, so saving from a notebook never writes into the notebooks' folder).
        local_search: False plans with the planner's greedy pass only (faster re-plans for many tables).
        profile: the calibration profile the time estimates use (a CalibrationProfile, a JSON path, or "default";
            rectoolkit.planner.profile), shown in the Measure tab; None: TorchRec's bandwidth-only terms.
    """

    def __init__(self, tables: Any, topology: Any = None, world_size: Optional[int] = None,
                 local_world_size: Optional[int] = None, memory_per_rank_gib: Optional[float] = None,
                 batch_size: Optional[int] = None, optimizer: str = "sgd", objective: str = "time",
                 compute_device: Optional[str] = None, forced: Optional[Dict[str, str]] = None,
                 plan_path: str = "plan.json", local_search: bool = True,
                 workdir: Optional[str] = None, profile: Any = None) -> None:
        from rectoolkit.planner.profile import load_profile

        self.profile = load_profile(profile)
        self.measurements = None  # the last Measure run (rectoolkit.planner.measure.PlanMeasurements)
        self.table_set = as_table_set(tables)
        self.settings = self._initial_settings(topology, world_size, local_world_size, memory_per_rank_gib,
                                               batch_size, optimizer, objective, compute_device, forced)
        self.settings.local_search = local_search
        self.baseline: Optional[ShardingPlan] = None
        self._board_message = ""  # what the board keeps saying when it is redrawn (its last move, during its re-price)
        self.last_timing_ms: Dict[str, float] = {}
        # Controls written by the explorer itself (to follow another control) must not re-plan on their own:
        # `_put` writes them while `_writing_controls` is set, and `_on_control` ignores those writes.
        self._writing_controls = False
        self.workdir = Path(workdir).expanduser().resolve() if workdir is not None else DEFAULT_WORKDIR
        self._build_controls(str(self.workdir / Path(plan_path).expanduser()))
        self.result: PlanningResult = plan_and_report(self.settings, self.table_set, self.profile)
        self._build_views()
        super().__init__([self.status, self.controls, self.tabs])
        self.add_class("rtk-explorer")
        self.tabs.observe(self._on_tab, names="selected_index")
        self._render()

    # ------------------------------------------------------------------ public API

    @property
    def plan(self) -> Optional[ShardingPlan]:
        return self.result.plan

    @property
    def error(self) -> Optional[str]:
        return self.result.error

    def set(self, **changes: Any) -> PlanningResult:
        """Change settings from Python (same path as the controls): world_size=8, optimizer="adam", ..."""
        world = changes.get("world_size", self.world_size.value)
        per_host = changes.get("local_world_size", changes.get("ranks_per_host"))
        if per_host is not None and isinstance(world, int) and world >= 1 and per_host not in self._divisors(world):
            raise ValueError(f"ranks per host {per_host!r} must divide the world size ({world}); "
                             f"choose one of {self._divisors(world)}")  # checked before any control changes
        for name, value in changes.items():
            control = self._control_for(name, value)
            self._put(control, value)
            self._follow(control)
        self.replan()
        return self.result

    def force(self, table: str, sharding_type: str) -> PlanningResult:
        """Force a table's sharding type ("row_wise", ...; "auto" lets the planner choose) and re-plan."""
        if table not in {t.name for t in self.table_set.tables}:
            raise KeyError(f"no table {table!r}; tables are {[t.name for t in self.table_set.tables]}")
        self._put(self.table_picker, table)
        self._put(self.type_picker, ShardingType.parse(sharding_type).value if sharding_type != AUTO else AUTO)
        self._apply_forced()
        self.replan()
        return self.result

    def replan(self) -> PlanningResult:
        """Read every control, plan again and redraw (called by each control change).

        Only the visible tab is redrawn at once; the others are redrawn when they are opened.
        `last_timing_ms` holds the CPU time of this process for planning and drawing (and the wall time).
        """
        start, start_wall = time.process_time(), time.perf_counter()
        self._set_busy("planning")
        try:
            settings = ExplorerSettings(
                world_size=int(self.world_size.value), local_world_size=int(self.local_world_size.value),
                memory_per_rank_gib=float(self.memory.value), batch_size=int(self.batch_size.value),
                optimizer=self.optimizer.value, objective=self.objective.value,
                compute_device=self.device.value, forced=dict(self.settings.forced),
                local_search=self.settings.local_search,
                moves=list(self.settings.moves) if self._same_shape(self.settings) else [],
            )
        except ValueError as error:
            self.result = PlanningResult(settings=self.settings, error=str(error))
            self._render()
            self._set_busy(None)
            return self.result
        self.settings = settings
        self.result = plan_and_report(settings, self.table_set, self.profile)
        planned = time.process_time()
        self._render()
        self._set_busy(None)
        done = time.process_time()
        self.last_timing_ms = {"plan_ms": 1e3 * (planned - start), "draw_ms": 1e3 * (done - planned),
                               "total_ms": 1e3 * (done - start), "wall_ms": 1e3 * (time.perf_counter() - start_wall)}
        return self.result

    TAB_NAMES = ("Placement", "Board", "Memory", "Time", "Communication", "Tables", "Compare", "Export", "Measure")

    def show_tab(self, name: str) -> None:
        """Open a tab by its title ("Memory", ...); it is redrawn if the plan changed since it was last shown."""
        if name not in self.TAB_NAMES:
            raise KeyError(f"no tab {name!r}; tabs are {list(self.TAB_NAMES)}")
        self.tabs.selected_index = self.TAB_NAMES.index(name)
        self._render_tab(self.tabs.selected_index)

    def redraw_all(self) -> None:
        """Redraw every tab now (the widget otherwise redraws hidden tabs when they are opened)."""
        for index in range(len(self.tabs.children)):
            self._render_tab(index)

    def explain(self, table: str, sharding_type: Optional[str] = None) -> str:
        """The planner's answer to "why this choice for `table`?" (or "why not `sharding_type`?")."""
        if self.result.planner is None:
            raise ValueError(f"there is no plan to explain: {self.error}")
        text = str(self.result.planner.explain(table, sharding_type))
        if self.settings.moves:
            text += "\n(The plan shown also has shards placed by hand on the board; this explains the planner's choice.)"
        return text

    def compare_with(self, plan: Optional[ShardingPlan] = None, path: Optional[str] = None) -> None:
        """Set the baseline for the Compare tab: a plan object, a saved JSON file, or (None) the current plan."""
        if path is not None:
            if not Path(path).exists():
                raise FileNotFoundError(f"no saved plan at {path}; save one first (Export tab) or pick another file")
            plan = planning.plan_from_json(Path(path).read_text(), self.table_set.tables, source=f"file {path}")
        self.baseline = plan if plan is not None else self.plan
        self._draw_diff()

    def save_plan(self, path: Optional[str] = None) -> Path:
        """Write the current plan as JSON (the planner's format) and return the path."""
        if self.plan is None:
            raise ValueError(f"there is no plan to save: {self.error}")
        target = self.workdir / Path(path or self.plan_path.value).expanduser()  # an absolute path stays as given
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(planning.plan_to_json(self.plan, self.table_set.tables))
        self.export_message.value = f"saved the plan to <code>{html.escape(str(target))}</code>"
        return target

    # ------------------------------------------------------------------ construction

    def _initial_settings(self, topology, world_size, local_world_size, memory_gib, batch_size, optimizer,
                          objective, compute_device, forced) -> ExplorerSettings:
        return initial_settings(self.table_set, topology, world_size, local_world_size, memory_gib, batch_size,
                                optimizer, objective, compute_device, forced)

    def _build_controls(self, plan_path: str) -> None:
        s = self.settings
        style = {"description_width": "initial"}
        sizes = sorted(set(WORLD_SIZES) | {s.world_size})
        self.world_size = w.Dropdown(options=sizes, value=s.world_size, description="world size", style=style,
                                     layout=w.Layout(width="150px"))
        self.local_world_size = w.Dropdown(options=self._divisors(s.world_size), value=s.local_world_size,
                                           description="ranks per host", style=style, layout=w.Layout(width="170px"))
        self.memory = w.BoundedFloatText(value=s.memory_per_rank_gib, min=0.001, max=1e6, step=1,
                                         description="memory per rank (GiB)", style=style,
                                         layout=w.Layout(width="230px"))
        self.batch_size = w.BoundedIntText(value=s.batch_size, min=1, max=10_000_000, description="batch size per rank",
                                           style=style, layout=w.Layout(width="220px"))
        self.optimizer = w.Dropdown(options=list(dict.fromkeys(OPTIMIZERS + [s.optimizer])), value=s.optimizer,
                                    description="optimizer", style=style, layout=w.Layout(width="220px"))
        self.objective = w.Dropdown(options=sorted(set(OBJECTIVES) | {s.objective}), value=s.objective,
                                    description="objective", style=style, layout=w.Layout(width="170px"))
        self.device = w.Dropdown(options=sorted(set(DEVICES) | {s.compute_device}), value=s.compute_device,
                                 description="device", style=style, layout=w.Layout(width="140px"))
        names = [t.name for t in self.table_set.tables]
        self.table_picker = w.Dropdown(options=names, value=names[0], description="table", style=style,
                                       layout=w.Layout(width="240px"))
        self.type_picker = w.Dropdown(options=SHARDING_CHOICES, value=s.forced.get(names[0], AUTO),
                                      description="sharding", style=style, layout=w.Layout(width="220px"))
        self.clear_forced = w.Button(description="all auto", tooltip="let the planner choose every table's type",
                                     layout=w.Layout(width="90px"))
        self.forced_label = w.HTML()
        self.plan_path = w.Text(value=plan_path, description="file", layout=w.Layout(width="520px"))
        for control in (self.world_size, self.local_world_size, self.memory, self.batch_size, self.optimizer,
                        self.objective, self.device, self.table_picker, self.type_picker):
            control.observe(self._on_control, names="value")
        self.clear_forced.on_click(self._on_clear_forced)
        self.status = w.HTML()
        self.busy = w.HTML(layout=w.Layout(width="160px"))  # "planning ..." while the kernel works
        self.controls = w.VBox([
            w.HBox([self.world_size, self.local_world_size, self.memory, self.batch_size, self.busy]),
            w.HBox([self.device, self.optimizer, self.objective, self.table_picker, self.type_picker,
                    self.clear_forced]),
            self.forced_label,
        ])

    def _build_views(self) -> None:
        self._painted = False  # shown in a notebook yet (see _repr_mimebundle_)
        self._paint_probe = PaintProbe()  # in the first tab: says when the page shows the explorer
        self.placement_fig, self.rank_table_fig = LazyFigure("the shard placement"), LazyFigure("the rank x table map")
        self.memory_fig, self.time_fig = LazyFigure("memory per rank"), LazyFigure("time per rank")
        self.comm_fig, self.diff_fig = LazyFigure("bytes per link"), LazyFigure("the comparison")
        self.memory_note, self.time_note = w.HTML(), w.HTML()
        self.collective = w.Dropdown(options=[TOTAL], value=TOTAL, description="collective")
        self.collective.observe(self._on_control, names="value")
        plan = self.result.plan or ShardingPlan({"": {}})
        self.board = PlacementBoard(plan, self.table_set.tables, world_size=self.settings.world_size,
                                    local_world_size=self.settings.local_world_size)
        self.board.on_move(self._on_board_move)
        self.choices = w.HTML()
        self.explain_button = w.Button(description="why this choice?")
        self.explain_out = w.HTML()
        self.explain_button.on_click(lambda _: self._explain())
        self.save_button = w.Button(description="Save plan JSON", icon="save")
        self.export_button = w.Button(description="Show TorchRec export", icon="share")
        self.pin_button = w.Button(description="Pin current plan", tooltip="use the current plan as the comparison baseline")
        self.load_button = w.Button(description="Compare with saved plan", icon="folder-open")
        self.export_message = w.HTML()
        self.export_text = w.Textarea(layout=w.Layout(width="100%", height="260px", display="none"))
        self.save_button.on_click(lambda _: self._guard(self.save_plan))
        self.export_button.on_click(lambda _: self._guard(self._show_export))
        self.pin_button.on_click(lambda _: self._guard(self.compare_with))
        self.load_button.on_click(lambda _: self._guard(
            lambda: self.compare_with(path=str(self.workdir / Path(self.plan_path.value).expanduser()))))
        self.diff_note = w.HTML("Pin a plan or load a saved one, then change settings to see what moves.")
        self.measure_steps = w.BoundedIntText(value=5, min=1, max=200, description="steps", layout=w.Layout(width="150px"))
        self.measure_button = w.Button(description="Measure", icon="play",
                                       tooltip="run the current (and pinned) plan on local CPU workers")
        self.measure_button.on_click(lambda _: self._guard_measure())
        self.measure_note, self.measure_fig = w.HTML(), LazyFigure("estimated vs measured step time")
        self.tabs = w.Tab(children=[
            w.VBox([self.placement_fig.container, self.rank_table_fig.container, self._paint_probe]),
            self.board,
            w.VBox([self.memory_note, self.memory_fig.container]),
            w.VBox([self.time_note, self.time_fig.container]),
            w.VBox([self.collective, self.comm_fig.container]),
            w.VBox([self.choices, w.HBox([self.explain_button]), self.explain_out]),
            w.VBox([w.HBox([self.pin_button, self.load_button]), self.diff_note, self.diff_fig.container]),
            w.VBox([w.HBox([self.plan_path, self.save_button, self.export_button]), self.export_message,
                    self.export_text]),
            w.VBox([w.HBox([self.measure_steps, self.measure_button]), self.measure_note, self.measure_fig.container]),
        ])
        for index, title in enumerate(self.TAB_NAMES):
            self.tabs.set_title(index, title)

    # ------------------------------------------------------------------ events

    def _control_for(self, name: str, value: Any):
        controls = {"world_size": self.world_size, "local_world_size": self.local_world_size,
                    "ranks_per_host": self.local_world_size, "memory_per_rank_gib": self.memory,
                    "batch_size": self.batch_size, "optimizer": self.optimizer, "objective": self.objective,
                    "compute_device": self.device, "device": self.device}
        if name not in controls:
            raise KeyError(f"no setting {name!r}; settings are {sorted(controls)}")
        control = controls[name]
        if name == "world_size":
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"world_size must be a positive int, got {value!r}")
            if value not in control.options:
                self._put(control, control.value, options=sorted(set(control.options) | {value}))
        return control

    def _put(self, control, value: Any, options: Optional[List[Any]] = None) -> None:
        """Write a control from Python without its observer re-planning (the caller re-plans once)."""
        was_writing, self._writing_controls = self._writing_controls, True
        try:
            if options is not None:
                control.options = options
            control.value = value
        finally:
            self._writing_controls = was_writing

    def _on_control(self, change) -> None:
        """The one observer of every control: a user's change (a click, or `control.value = x` in Python)."""
        if self._writing_controls:
            return
        control = change["owner"]
        if control is self.collective:
            self._draw_comm()
            return
        self._follow(control)
        if control is not self.table_picker:
            self.replan()

    def _follow(self, control) -> None:
        """Bring the controls that depend on `control` in line with it, before anything re-plans."""
        if control is self.world_size:
            divisors = self._divisors(int(self.world_size.value))
            current = self.local_world_size.value
            self._put(self.local_world_size, current if current in divisors else divisors[-1], options=divisors)
        elif control is self.table_picker:
            self._put(self.type_picker, self.settings.forced.get(self.table_picker.value, AUTO))
        elif control is self.type_picker:
            self._apply_forced()

    def _apply_forced(self) -> None:
        table, choice = self.table_picker.value, self.type_picker.value
        if choice == AUTO:
            self.settings.forced.pop(table, None)
        else:
            self.settings.forced[table] = choice

    def _on_clear_forced(self, _button) -> None:
        self.settings.forced.clear()
        self.settings.moves.clear()
        self._follow(self.table_picker)
        self.replan()

    def _on_board_move(self, _plan, table: str, shard: int, rank: int) -> None:
        self.settings.moves.append((table, shard, rank))
        self._board_message = self.board.message  # "moved t shard s to rank r" stays on the re-priced board
        try:
            self.replan()
        finally:
            self._board_message = ""

    def _on_tab(self, _change) -> None:
        index = self.tabs.selected_index
        if index in self._stale:
            self._set_busy(f"drawing {self.TAB_NAMES[index]}")
            self._render_tab(index)
            self._set_busy(None)

    def _set_busy(self, what: Optional[str]) -> None:
        """Show what the kernel is doing (sent at once, so the browser shows it while the work runs)."""
        self.busy.value = ("" if what is None else
                           f'<span class="rtk-busy" style="color:#b45309">{SPINNER}{html.escape(what)} ...</span>')

    def _guard(self, action) -> None:
        try:
            action()
        except Exception as error:  # shown in the widget, never as a traceback
            self.export_message.value = error_box(f"{type(error).__name__}: {error}")

    @staticmethod
    def _divisors(world_size: int) -> List[int]:
        return [d for d in range(1, world_size + 1) if world_size % d == 0]

    def _same_shape(self, old: ExplorerSettings) -> bool:
        return (int(self.world_size.value) == old.world_size
                and int(self.local_world_size.value) == old.local_world_size)

    # ------------------------------------------------------------------ drawing

    def _repr_mimebundle_(self, **kwargs):
        """The first display paints the explorer at once, with placeholders where its figures go, and sends
        the figures once the page shows it: the page's first plotly figure waits for plotly.js to load and
        parse (1-2 s, more on a busy machine), which would otherwise hold back the whole explorer."""
        if not self._painted:
            self._painted = True
            figures = (self.placement_fig, self.rank_table_fig, self.memory_fig, self.time_fig, self.comm_fig,
                       self.diff_fig, self.measure_fig)
            held = [figure for figure in figures if figure.hold()]
            self._paint_probe.when_painted(lambda: [figure.release() for figure in held])
        return super()._repr_mimebundle_(**kwargs)

    def _render(self) -> None:
        self._draw_status()
        self._stale = set(range(len(self.tabs.children)))
        self._render_tab(self.tabs.selected_index or 0)

    def _render_tab(self, index: Optional[int]) -> None:
        if index is None or index not in self._stale:
            return
        self._stale.discard(index)
        if not self.result.ok:
            self._draw_no_plan(index)
            return
        [self._draw_placement, self._draw_board, self._draw_memory, self._draw_time, self._draw_comm,
         self._draw_choices, self._draw_diff, self._draw_export, self._draw_measure][index]()

    def _draw_no_plan(self, index: int) -> None:
        """Without a plan for the settings shown, a tab says so instead of keeping the last plan's pictures."""
        error = self.result.error or "no plan"
        if index == self.TAB_NAMES.index("Board"):
            self.board.set_plan(ShardingPlan({"": {}}), world_size=self.settings.world_size,
                                local_world_size=self.settings.local_world_size)
            self.board.show_error(error)
            return
        figures = {"Placement": [self.placement_fig, self.rank_table_fig], "Memory": [self.memory_fig],
                   "Time": [self.time_fig], "Communication": [self.comm_fig], "Compare": [self.diff_fig]}
        for figure in figures.get(self.TAB_NAMES[index], []):
            figure.show_note(NO_PLAN_NOTE)
        if self.TAB_NAMES[index] == "Tables":
            self.choices.value = f"<i>{html.escape(NO_PLAN_NOTE)}</i>"
        elif self.TAB_NAMES[index] == "Compare" and self.baseline is not None:
            self.diff_note.value = f"baseline vs current: {html.escape(NO_PLAN_NOTE)}"
        elif self.TAB_NAMES[index] == "Export":
            self.export_text.layout.display = "none"

    def measure(self, steps: int = 5, rounds: int = 2):
        """Run the current plan, and the pinned baseline if any, on local CPU workers for a few steps
        (rectoolkit.planner.measure_plans) and show measured beside estimated step time per rank (Measure tab).
        Blocks while the workers run (tens of seconds); returns the PlanMeasurements."""
        self._set_busy(f"measuring on {self.settings.world_size} local workers")
        try:
            self.measurements = measure_current_and_pinned(self.result, self.table_set, self.baseline, self.profile,
                                                           steps=steps, rounds=rounds)
        finally:
            self._set_busy(None)
        self._stale.add(self.TAB_NAMES.index("Measure"))
        self._render_tab(self.tabs.selected_index)
        return self.measurements

    def _guard_measure(self) -> None:
        try:
            self.measure(int(self.measure_steps.value))
        except Exception as error:  # shown in the tab, never as a traceback
            self.measure_note.value = error_box(f"{type(error).__name__}: {error}")

    def _draw_measure(self) -> None:
        self.measure_note.value = measure_note(self.profile, self.measurements)
        if self.measurements is not None:
            self.measure_fig.show(*measured_vs_estimated_traces(self.measurements.ranks))

    def _draw_status(self) -> None:
        self.forced_label.value = forced_label(self.settings)
        self.status.value = status_html(self.result, self.settings, len(self.table_set.tables))

    def _draw_placement(self) -> None:
        placement = self.result.placement
        self.placement_fig.show(*shard_placement_traces(placement, self.settings.world_size))
        self.rank_table_fig.show(*rank_table_traces(placement, self.settings.world_size))

    def _draw_board(self) -> None:
        memory_bytes, capacity = None, self.settings.memory_per_rank_bytes
        if self.result.memory is not None:
            from rectoolkit.viz.memory import memory_stacks, primary_memory

            memory = self.result.memory
            _, _, values, cap, _ = memory_stacks(memory)
            used_col = primary_memory(memory)[0]
            memory_bytes = list(memory[used_col].to_numpy(dtype=float) if used_col else values.sum(axis=0))
            if np.isfinite(cap).all():
                capacity = list(cap)
        self.board.set_plan(self.result.plan, world_size=self.settings.world_size, capacity_bytes=capacity,
                            memory_bytes=memory_bytes, message=self._board_message,
                            local_world_size=self.settings.local_world_size, placement=self.result.placement)

    def _draw_memory(self) -> None:
        if self.result.memory is None:
            self.memory_note.value = _EMPTY_MEMORY_NOTE
            return
        self.memory_note.value = ""
        self.memory_fig.show(*memory_traces(self.result.memory))

    def _draw_time(self) -> None:
        if self.result.time is None:
            self.time_note.value = "the planner's report has no per-rank time table"
            return
        self.time_note.value = ""
        self.time_fig.show(*rank_time_traces(self.result.time))

    def _draw_comm(self) -> None:
        if not self.result.ok or self.result.comm is None:
            return
        options = list(comm_options(self.result.comm))
        if list(self.collective.options) != options:
            current = self.collective.value
            self._put(self.collective, current if current in options else TOTAL, options=options)
        self.comm_fig.show(*comm_matrix_traces(self.result.comm, self.collective.value))

    def _draw_choices(self) -> None:
        choices = planning.full_choices(self.result)
        if choices is None:
            self.choices.value = "<i>the planner's report has no per-table choices</i>"
            return
        columns = [c for c in ("table", "rows", "dim", "sharding_type", "compute_kernel", "ranks", "slowest_ms",
                               "runner_up", "runner_up_ms", "reason") if c in choices.columns]
        self.choices.value = html_table(choices, columns)

    def _explain(self) -> None:
        table = self.table_picker.value
        try:
            if self.result.planner is None:
                raise ValueError(f"there is no plan to explain: {self.error}")
            text = self.explain(table)
        except Exception as error:
            text = f"{type(error).__name__}: {error}"
        self.explain_out.value = f"<pre style='white-space:pre-wrap'>{html.escape(text)}</pre>"

    def _draw_diff(self) -> None:
        if self.baseline is None or self.plan is None:
            return
        diff = plan_diff(self.baseline, self.plan, self.table_set.tables)
        self.last_diff = diff
        self.diff_note.value = f"baseline vs current: {html.escape(diff.summary())}"
        self.diff_fig.show(*plan_diff_traces(diff))

    def _draw_export(self) -> None:
        if self.export_text.layout.display != "none":  # an export on show is always the current plan's
            self._show_export()

    def _show_export(self) -> None:
        if self.plan is None:
            raise ValueError(f"there is no plan to export: {self.error}")
        path = self.workdir / Path(self.plan_path.value).expanduser()
        self.export_text.value = planning.torchrec_export_text(self.plan, str(path))
        self.export_text.layout.display = ""
        saved = "" if path.exists() else " (save it first so the file exists)"
        self.export_message.value = f"The plan for TorchRec, loading <code>{html.escape(str(path))}</code>{saved}"
