"""The views a kind of runs adds to the views every run has: serving runs their serving view (request
waterfall, engine steps, server metrics, a sweep's curves), generation runs their generation view (TTFT, TPOT,
decode timelines), the ranks of one distributed job the ranks view (stragglers, all ranks on one time axis).
Every surface that lays out runs (the HTML report, the panel's dashboard and compare routes, the notebook)
places them through `with_kind_views`, so they all show the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bokeh.models import LayoutDOM, TabPanel, Tabs

from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import GENERATION


def is_rank_set(bundles: Sequence[Bundle]) -> bool:
    """Whether `bundles` are two or more ranks of a job (`workbench import --ranks`), each rank once."""
    ranks = [bundle.record.rank for bundle in bundles]
    return len(ranks) >= 2 and None not in ranks and len(set(ranks)) == len(ranks)


def kind_views(bundles: Sequence[Bundle], *, width: int | None = None) -> list[TabPanel]:
    """The tabs the kinds of `bundles` add: "serving" when some are serving runs, "generation" when some are
    generation runs, "ranks" when they are the ranks of a job; none for other runs. `width` is the layout's width
    in pixels (the views' default when None)."""
    from workbench.views.serving import serving_panels

    sized = {} if width is None else {"width": width}
    panels = serving_panels(bundles, width=width)
    generation = [bundle for bundle in bundles if bundle.record.kind == GENERATION]
    if generation:
        from workbench.views.llm import generation_view

        panels.append(TabPanel(child=generation_view(generation, **sized), title="generation"))
    if is_rank_set(bundles):
        from workbench.views.ranks import bundles_ranks_view

        panels.append(TabPanel(child=bundles_ranks_view(bundles, **sized), title="ranks"))
    return panels


def with_kind_views(layout: LayoutDOM, bundles: Sequence[Bundle], title: str, *,
                    width: int | None = None) -> LayoutDOM:
    """`layout` (the views every run has, of `bundles`) after the tabs of their kinds, in a tab named `title`;
    `layout` itself when their kinds add nothing."""
    panels = kind_views(bundles, width=width)
    if not panels:
        return layout
    return Tabs(tabs=[*panels, TabPanel(child=layout, title=title)])


def runs_layout(views: Callable[[], LayoutDOM], bundles: Sequence[Bundle], title: str, *,
                width: int | None = None) -> LayoutDOM:
    """`with_kind_views(views(), ...)`, except for the ranks of a job too large to read here or on a URL root
    (`views.ranks.aggregates_only`): their ranks view alone, since the views every run has would read every
    rank whole."""
    from workbench.views.ranks import aggregates_only, bundles_ranks_view

    if is_rank_set(bundles) and aggregates_only(bundles) is not None:
        return bundles_ranks_view(bundles, **({} if width is None else {"width": width}))
    return with_kind_views(views(), bundles, title, width=width)
