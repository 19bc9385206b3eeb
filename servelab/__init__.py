"""ServeLab: the machinery behind the model-serving lab.

Lesson code lives in the service folders (fastapi_pt/, fastapi_onnx/,
flask_app/, models_staging/); this package holds what students should not
need to read to learn the lesson.
"""

__version__ = "0.1.0"
