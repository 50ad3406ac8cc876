"""Date formats that name the zone (``FORMAT_MODULE_PATH``): Django's own
English ones read "Aug. 21, 2026, 2 a.m." with no zone at all."""
