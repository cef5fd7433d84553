"""``petastorm.fs_utils``: unihub's URL-to-filesystem resolver."""

from unihub import FilesystemResolver, get_dataset_path, get_filesystem_and_path_or_paths, normalize_dir_url

__all__ = ["FilesystemResolver", "get_dataset_path", "get_filesystem_and_path_or_paths", "normalize_dir_url"]
