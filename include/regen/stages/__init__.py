"""The pipeline's stages, one room each: prepare, generate, validate, export, publish. None imports another: they
meet only through storage (the keys in regen.layout) and the small manifests the DAG passes between tasks.
"""
