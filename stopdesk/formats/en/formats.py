"""Times to the second, with their zone. The admin shows every time through these formats, and an
auditor lining events up against another system's log needs the seconds ("2:46 p.m." cannot say
which of two events came first). Pages that show times choose their own format."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
TIME_FORMAT = "H:i:s"
