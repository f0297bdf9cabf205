"""bloomline.trainer: the BLOOM-recipe GPT trainer (model, parallelism, loop).

The trainer arrives with issue [4]; this package holds its place in the monorepo so that the
dependency direction (common <- dataprep <- trainer) is enforced from the first commit.
"""

__all__: list[str] = []
