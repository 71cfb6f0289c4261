"""`nasplat report` and `nasplat serve`: one self-contained HTML page about an experiment folder.

`frame` reads the folder into the frames every section shares (and the HTML table helpers), `sections` writes
the sections and the page, `rungs` the ASHA / Hyperband section, `plots` draws the SVG figures, `serve` keeps the
page live over HTTP.
"""

from nasplat.report.sections import REPORT_FILE, build_report, render_report

__all__ = ["REPORT_FILE", "build_report", "render_report"]
