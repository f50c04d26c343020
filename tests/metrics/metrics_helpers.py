"""Scraping a metrics endpoint over real HTTP, as Prometheus does, and reading values back."""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """One scrape: ``value(name, **labels)`` of a sample (``name`` as exposed, with its
    ``_total``/``_count``/``_sum`` suffix)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.samples[s.name, frozenset(s.labels.items())] = s.value

    def value(self, name: str, **labels) -> float:
        key = (name, frozenset((k, str(v)) for k, v in labels.items()))
        if key not in self.samples:
            near = sorted(f"{n}{dict(ls)}" for n, ls in self.samples if n == name)
            raise AssertionError(f"no sample {name}{labels}; samples of that name: {near}")
        return self.samples[key]

    def has(self, name: str, **labels) -> bool:
        return (name, frozenset((k, str(v)) for k, v in labels.items())) in self.samples

    def names(self) -> set[str]:
        return {n for n, _ in self.samples}


def scrape(address: str, path: str = "/metrics") -> Scrape:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        return Scrape(response.read().decode())
