"""The admin's static files are served by the application itself (whitenoise), so the operator
screens have their CSS and JavaScript under gunicorn, in ``make serve`` and in the image, with
``DEBUG`` off and no ``collectstatic`` step."""

from __future__ import annotations

from django.conf import settings
from django.test import Client


def test_admin_css_and_js_are_served_with_debug_off():
    assert settings.DEBUG is False
    client = Client()
    css = client.get("/static/admin/css/base.css")
    assert css.status_code == 200
    assert css["Content-Type"].startswith("text/css")
    body = b"".join(css.streaming_content) if css.streaming else css.content
    assert b"body" in body and len(body) > 1000
    js = client.get("/static/admin/js/core.js")
    assert js.status_code == 200
    assert "javascript" in js["Content-Type"]


def test_an_unknown_static_file_is_404_not_a_500():
    assert Client().get("/static/admin/css/no-such-file.css").status_code == 404
