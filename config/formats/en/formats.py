"""English formats with the zone named (``T``: "UTC", "EDT", "CEST"), in
the current time zone: the viewer's (``retention.middleware.ViewerTimeZone``)."""

DATETIME_FORMAT = "Y-m-d H:i T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
