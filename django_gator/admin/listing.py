"""The job list on a large table: its count, its first page and its search box.

On a jobs table of millions of rows, what Django's admin does by default costs seconds:

- **The count.** The unfiltered list is counted from the database's row estimate. A
  filtered list is counted exactly up to :attr:`EstimatedCountPaginator.exact_up_to` rows
  (a COUNT that stops there); past that, on PostgreSQL, its size is the planner's estimate
  for the filter (counting the succeeded jobs of 5,000,000 took 2 s).
- **The first page.** A filtered list's first page is read before the count, one row more
  than a page: when that is all there is, it is the count, and the page is not read again.
  A filter that matches few rows among millions, on a column without an index (a rare
  queue or job name), reads the whole table once instead of twice (for the count, then for
  the rows), and by a plain scan rather than a walk of the primary key (see
  :func:`first_rows`).
- **The search box.** Text (job name, error, argument text) has no index: the database
  reads every row of the list it searches (6 to 15 s at 5,000,000 rows). A text search
  reads at most the jobs with the newest :data:`SEARCH_WINDOW` ids when the list it
  searches is larger than that (the table's row estimate, or on PostgreSQL the planner's
  estimate for the filtered list: a search among the dead jobs reads them all). The page
  then says which ids it searched, with a link that searches every row
  (``search_all=1``). A term of digits also finds the job with that id, wherever it is.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import Page, Paginator
from django.db.models import BigIntegerField, ExpressionWrapper, F, Max, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import IContains
from django.http import HttpRequest, HttpResponse
from django.utils.functional import cached_property

from django_gator import stats
from django_gator.engines.listing import planned_rows
from django_gator.models import Job

#: Job ids a text search reads at most, unless asked to read everything (on PostgreSQL, a
#: search of the newest 50,000 rows took 100-150 ms for the list and its count).
SEARCH_WINDOW = 50_000
#: The query parameter that asks for a search of every row.
SEARCH_ALL = "search_all"


class EstimatedCountPaginator(Paginator):
    """The job list's count (see the module's docstring). ``first_page``: the first page
    is the one shown, so a filtered list's count reads it first (:attr:`head`)."""

    #: Rows a filtered list counts exactly.
    exact_up_to = 10_000

    def __init__(self, *args: Any, first_page: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_page = first_page
        #: The first page's rows and one more, when the count read them.
        self.head: list[Any] | None = None

    @cached_property
    def count(self) -> int:
        object_list: Any = self.object_list
        query = getattr(object_list, "query", None)
        if query is None:
            return super().count
        if not query.where:
            total, _exact = stats.estimated_total(getattr(object_list, "db", None))
            return total
        if self.first_page:
            self.head = list(first_rows(object_list)[: self.per_page + 1])
            if len(self.head) <= self.per_page:
                return len(self.head)
        capped = object_list.order_by()[: self.exact_up_to + 1].count()
        if capped <= self.exact_up_to:
            return capped
        planned = planned_rows(object_list)
        return super().count if planned is None else max(planned, capped)

    def page(self, number: Any) -> Page:
        if self.head is not None and self.validate_number(number) == 1:
            return Page(self.head[: self.per_page], 1, self)
        return super().page(number)


#: A filtered list PostgreSQL expects to be this short is read whole and sorted, rather
#: than by walking the primary key from the newest job until a page is found.
FEW_ROWS = 200
#: The job list's default order (the ChangeList may repeat it, as its tie-breaker).
NEWEST_FIRST = {"-id", "-pk"}


def first_rows(queryset: Any) -> Any:
    """``queryset`` (newest first), ordered so that PostgreSQL reads a short list whole.

    Ordered by ``-id``, PostgreSQL finds a page of a filtered list by walking the primary
    key from the newest job, which is fast when the filter matches often and reads the
    whole table's index and rows when it matches a few dozen rows of millions (a queue or
    job name without an index: 1.5-2 s at 5,000,000 rows). When the planner expects at
    most :data:`FEW_ROWS`, the same order by ``id + 0`` makes it read the rows by their
    own filter (or a plain scan) and sort them: the same rows in the same order."""
    order = set(queryset.query.order_by)
    if not order or not order <= NEWEST_FIRST:
        return queryset
    planned = planned_rows(queryset)
    if planned is None or planned > FEW_ROWS:
        return queryset
    return queryset.order_by(id_not_indexed().desc())


def id_not_indexed() -> ExpressionWrapper:
    """``id + 0``: the job's id as an expression, which sorts like the id but which no
    index serves, so that PostgreSQL finds the rows by the query's filter and sorts them
    rather than walking the primary key in order."""
    return ExpressionWrapper(F("id") + 0, output_field=BigIntegerField())


class JobChangeList(ChangeList):
    """Shows the first page its paginator read for the count (Django would read a list of
    one page again)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        # The captured logs (up to GATOR_JOB_LOG_BYTES per attempt) are shown on a job's
        # page only: the list does not read them.
        return super().get_queryset(request, exclude_parameters).defer("captured_logs")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        head = getattr(self.paginator, "head", None)
        if head is not None and not self.multi_page:
            self.result_list = head


def window_start(queryset: Any) -> int | None:
    """The lowest job id a text search of ``queryset`` reads, or None to read all of it."""
    db = queryset.db
    total, _exact = stats.estimated_total(db)
    if total <= SEARCH_WINDOW:
        return None
    if queryset.query.where:
        planned = planned_rows(queryset)
        if planned is not None and planned <= SEARCH_WINDOW:
            return None
    newest = Job.objects.using(db).aggregate(newest=Max("pk"))["newest"]
    if newest is None or newest <= SEARCH_WINDOW:
        return None
    return int(newest) - SEARCH_WINDOW + 1


class JobListing(admin.ModelAdmin):
    """The list part of ``JobAdmin``: its paginator, its change list and its search."""

    paginator = EstimatedCountPaginator
    # The id is matched by get_search_results() itself: Django's "=id" compares the id as
    # text (UPPER(id::text) = ...), which no index serves.
    search_fields = ("name", "last_error", "fairness_key")
    search_help_text = (
        "Search by id, job name, error text, fairness key or argument text. On a large list, "
        f"text is searched in the newest {SEARCH_WINDOW:,} job ids (the page says so, with a link "
        "that searches them all)."
    )

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return JobChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: Any,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        return EstimatedCountPaginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            first_page=request.GET.get(PAGE_VAR, "1") == "1",
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The admin refuses query parameters it does not know: take ours out first.
        search_all = request.GET.get(SEARCH_ALL) == "1"
        if SEARCH_ALL in request.GET:
            query = request.GET.copy()
            del query[SEARCH_ALL]
            request.GET = query  # type: ignore[assignment]
        request._gator_search_all = search_all  # type: ignore[attr-defined]
        response = super().changelist_view(request, extra_context)
        searched_from = getattr(request, "_gator_searched_from", None)
        context = getattr(response, "context_data", None)
        if searched_from is not None and context is not None:
            query = request.GET.copy()
            query[SEARCH_ALL] = "1"
            context["gator_search_window"] = {
                "from_id": searched_from,
                "size": SEARCH_WINDOW,
                "all_url": f"?{query.urlencode()}",
            }
        return response

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> Any:
        term = search_term.strip()
        if not term:
            return super().get_search_results(request, queryset, search_term)
        start = None
        if not getattr(request, "_gator_search_all", False):
            start = window_start(queryset)
        searched = queryset if start is None else queryset.filter(pk__gte=start)
        results, may_have_duplicates = super().get_search_results(request, searched, search_term)
        if term.isdigit():
            results = results | queryset.filter(pk=int(term))
        else:
            # A condition on each row, not ``pk IN (subquery)``: on partitioned storage
            # PostgreSQL planned that subquery once per partition, each reading the window
            # (0.8 s of a search at 20,000,000 rows, docs/benchmarks.md).
            results = results | searched.filter(IContains(Cast("args", TextField()), term))
        if start is not None:
            request._gator_searched_from = start  # type: ignore[attr-defined]
        return results, may_have_duplicates
