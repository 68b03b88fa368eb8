"""What pactl keeps on disk, as leaves every layer may use, in reading order:

- generations.py: folders that change as a whole: generations, the writer lock, atomic writes,
  crash points;
- regular_files.py: opening a file a user names, a regular file only;
- json_fields.py: checks on the JSON records pactl reads back;
- checksums.py: content checksums of a generation's files;
- csv_cells.py: the one CSV writer, cells no spreadsheet runs;
- home.py: $PACTL_HOME, where datasets and runs live;
- item_table.py: the item table (id, path, label, size, mtime) of vectors folders, bundles and
  Parquet;
- vectors_folder.py: the vectors folder's format, spelled once (its name, version, files, widest
  vector) and the Vectors record its readers return.
"""
