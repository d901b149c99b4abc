"""A transport module whose import fails for want of an optional package, as the broker modules do."""

from django_outbox.exceptions import MissingExtraError

raise MissingExtraError(package="not-installed-client", extra="imaginary", feature="ImaginaryTransport")
