"""Static files through the middleware chain (apps.core.middleware.StaticFilesMiddleware): each chain a
process builds serves every app's files, found once."""

from __future__ import annotations

from pathlib import Path

from django.contrib.staticfiles import finders
from django.test import Client

from apps.core.middleware import StaticFilesMiddleware


def test_every_chain_serves_project_and_app_static_files_with_cache_headers():
    own = finders.find("css/capacity.css")
    for _ in range(2):  # a second client builds a second chain from the files the first one found
        client = Client()
        response = client.get("/static/css/capacity.css")
        assert response.status_code == 200
        assert b"".join(response.streaming_content) == Path(own).read_bytes()
        assert "max-age" in response["Cache-Control"]
        assert client.get("/static/admin/css/base.css").status_code == 200
        assert client.get("/static/css/no-such-file.css").status_code == 404


def test_chains_share_one_listing_of_the_finders_files():
    first, second = StaticFilesMiddleware(lambda r: None), StaticFilesMiddleware(lambda r: None)
    url = "/static/css/capacity.css"
    assert first.files[url] is second.files[url]
    assert len(first.files) == len(second.files) > 100  # the apps' files too (admin, DRF, drf-spectacular)


def test_a_changed_static_setting_is_found_again(settings, tmp_path):
    StaticFilesMiddleware(lambda r: None)  # the listing cached with the project's settings
    (tmp_path / "only-here.css").write_text("p{}")
    settings.STATICFILES_DIRS = [tmp_path]
    assert "/static/only-here.css" in StaticFilesMiddleware(lambda r: None).files
