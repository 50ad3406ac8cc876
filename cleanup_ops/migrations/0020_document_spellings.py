"""A storage document's identity is the name the storage will act on (issue 37).

``DocumentSpelling`` (a living record spells a key other than its canonical
name) and ``cleanup_ops_storage_name(rule, location, key)``: the SQL twin of
``downstream.stores.AttachmentStore.canonical``, which the reference guard's
trigger applies to the keys the application writes. It returns NULL where the
storage refuses the name (Python raises), so it never names a file the
storage would not. ``tests/test_storage_names.py`` proves it and Python agree.

The functions are frozen here, as any migration is: a change to a rule is a
new migration that replaces them (``CREATE OR REPLACE``).
"""

from django.db import migrations, models

# posixpath.normpath (CPython 3.11), step for step: POSIX keeps exactly two
# leading slashes; "." and empty segments go; ".." pops a segment, except at
# the start of a relative path or after another kept "..", and vanishes at
# the root.
NORMPATH = r"""
CREATE OR REPLACE FUNCTION cleanup_ops_posix_normpath(path text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $normpath$
DECLARE
    initial integer := 0;
    kept text[] := '{}';
    segment text;
    n integer;
    result text;
BEGIN
    IF path = '' THEN
        RETURN '.';
    END IF;
    IF left(path, 1) = '/' THEN
        initial := 1;
        IF left(path, 2) = '//' AND left(path, 3) <> '///' THEN
            initial := 2;
        END IF;
    END IF;
    FOREACH segment IN ARRAY string_to_array(path, '/') LOOP
        IF segment = '' OR segment = '.' THEN
            CONTINUE;
        END IF;
        n := coalesce(array_length(kept, 1), 0);
        IF segment <> '..' OR (initial = 0 AND n = 0) OR (n > 0 AND kept[n] = '..') THEN
            kept := kept || segment;
        ELSIF n > 0 THEN
            kept := kept[1:n - 1];
        END IF;
    END LOOP;
    result := repeat('/', initial) || array_to_string(kept, '/');
    IF result = '' THEN
        RETURN '.';
    END IF;
    RETURN result;
END
$normpath$
"""

# django-storages' S3Storage (1.14): ``_normalize_name(clean_name(key))`` —
# clean_name, then safe_join(location, name) — then the bucket key relative
# to the location (``S3Store.canonical``). NULL: refused (outside the
# location, empty, longer than S3 takes, or the location itself).
S3_NAME = r"""
CREATE OR REPLACE FUNCTION cleanup_ops_s3_name(location text, key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $s3$
DECLARE
    cleaned text;
    base text := rtrim(location, '/');
    final text;
    object_key text;
    name text;
BEGIN
    -- clean_name: normpath, then backslashes as slashes (after: "a\..\b" stays
    -- "a/../b" here, safe_join resolves it), a trailing slash kept, "." empty.
    cleaned := replace(cleanup_ops_posix_normpath(key), '\', '/');
    IF right(key, 1) = '/' AND right(cleaned, 1) <> '/' THEN
        cleaned := cleaned || '/';
    END IF;
    IF cleaned = '.' THEN
        cleaned := '';
    END IF;
    -- safe_join(location, cleaned): posixpath.join(base + '/', cleaned), normalised.
    IF left(cleaned, 1) = '/' THEN
        final := cleanup_ops_posix_normpath(cleaned);
    ELSE
        final := cleanup_ops_posix_normpath(base || '/' || cleaned);
    END IF;
    IF right(cleaned, 1) = '/' OR final || '/' = base || '/' THEN
        final := final || '/';
    END IF;
    IF final = base THEN
        final := final || '/';
    END IF;
    IF NOT starts_with(final, base) OR substr(final, length(base) + 1, 1) <> '/' THEN
        RETURN NULL;
    END IF;
    object_key := ltrim(final, '/');
    IF object_key = '' OR octet_length(object_key) > 1024 THEN
        RETURN NULL;
    END IF;
    IF base = '' THEN
        name := object_key;
    ELSE
        name := substr(object_key, length(base) + 2);
    END IF;
    IF name = '' THEN
        RETURN NULL;
    END IF;
    RETURN name;
END
$s3$
"""

# Django's FileSystemStorage.path(key) — django.utils._os.safe_join(location,
# key): abspath(join(location, key)), inside the location — relative to the
# location (``StorageStore.canonical``). The location is the storage's
# absolute ``location``; NULL: refused (outside it, or the location itself).
FILE_SYSTEM_NAME = r"""
CREATE OR REPLACE FUNCTION cleanup_ops_file_system_name(location text, key text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fs$
DECLARE
    base text := cleanup_ops_posix_normpath(location);
    final text;
    name text;
BEGIN
    IF left(key, 1) = '/' THEN
        final := cleanup_ops_posix_normpath(key);
    ELSIF right(location, 1) = '/' THEN
        final := cleanup_ops_posix_normpath(location || key);
    ELSE
        final := cleanup_ops_posix_normpath(location || '/' || key);
    END IF;
    IF NOT (starts_with(final, base || '/') OR final = base OR base IN ('/', '//')) THEN
        RETURN NULL;
    END IF;
    name := ltrim(substr(final, length(base) + 1), '/');
    IF name = '' THEN
        RETURN NULL;
    END IF;
    RETURN name;
END
$fs$
"""

STORAGE_NAME = r"""
CREATE OR REPLACE FUNCTION cleanup_ops_storage_name(rule text, location text, key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $name$
    SELECT CASE rule
        WHEN 's3' THEN cleanup_ops_s3_name(location, key)
        WHEN 'file_system' THEN cleanup_ops_file_system_name(location, key)
        ELSE key
    END
$name$
"""

DROP = """
DROP FUNCTION IF EXISTS cleanup_ops_storage_name(text, text, text);
DROP FUNCTION IF EXISTS cleanup_ops_file_system_name(text, text);
DROP FUNCTION IF EXISTS cleanup_ops_s3_name(text, text);
DROP FUNCTION IF EXISTS cleanup_ops_posix_normpath(text);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("cleanup_ops", "0019_table_partition_drops"),
    ]

    operations = [
        migrations.CreateModel(
            name="DocumentSpelling",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("document_id", models.CharField(max_length=1089)),
                ("spelling", models.CharField(max_length=1024)),
            ],
            options={
                "ordering": ["id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("document_id", "spelling"), name="document_spelling_one_per_spelling"
                    )
                ],
            },
        ),
        migrations.RunSQL(
            sql=[NORMPATH, S3_NAME, FILE_SYSTEM_NAME, STORAGE_NAME],
            reverse_sql=DROP,
        ),
    ]
