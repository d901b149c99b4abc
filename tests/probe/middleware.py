"""A middleware that reads the form after the view, as django-debug-toolbar's request panel does."""

import hashlib
from collections.abc import Callable

from django.http import HttpRequest
from django.http.response import HttpResponseBase


class FormAfterViewMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        digest = hashlib.sha256()
        for uploads in request.FILES.lists():
            for upload in uploads[1]:
                for chunk in upload.chunks():
                    digest.update(chunk)
        response["X-Form-After-View"] = f"{len(request.POST)} fields, files {digest.hexdigest()}"
        return response
