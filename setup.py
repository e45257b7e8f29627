"""Build hook: the widgets' front end (ES modules, CSS) is kept in one copy, the top-level widgets/ folder, and
copied into the package (rectoolkit/widgets/static/) when a wheel is built. Everything else is in pyproject.toml.
A source checkout (and an editable install) loads widgets/ directly (rectoolkit.widgets.assets)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WIDGET_SOURCES = Path(__file__).resolve().parent / "widgets"


class BuildPyWithWidgetAssets(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "rectoolkit" / "widgets" / "static"
        target.mkdir(parents=True, exist_ok=True)
        for source in sorted(WIDGET_SOURCES.iterdir()):
            if source.suffix in (".js", ".css"):
                self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithWidgetAssets})
