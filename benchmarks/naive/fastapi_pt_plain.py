"""Plain reference for bench_naive.py: shares nothing with the kit.

The FastAPI + PyTorch service as a student writes it from the lab's snippets:
PIL decode, torchvision Resize/CenterCrop/ToTensor/Normalize, model.eval(),
torch.no_grad(), torch's default threads, no middleware, no input checks.
It imports nothing from servelab (tests/bench/test_naive_references.py checks).

    MODEL_PATH=fastapi_pt/food11.pth uvicorn fastapi_pt_plain:app   (from benchmarks/naive/)
"""

import base64
import io
import os

import torch
import torchvision.transforms as transforms
from fastapi import FastAPI
from PIL import Image
from pydantic import BaseModel

CLASSES = ["Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat",
           "Noodles/Pasta", "Rice", "Seafood", "Soup", "Vegetable/Fruit"]

model = torch.load(os.environ.get("MODEL_PATH", "food11.pth"), map_location="cpu", weights_only=False)
model.eval()

transform = transforms.Compose([
    transforms.Resize((224, 224)),
    transforms.CenterCrop(224),
    transforms.ToTensor(),
    transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
])

app = FastAPI()


class ImageRequest(BaseModel):
    image: str  # base64 JPEG/PNG


class PredictionResponse(BaseModel):
    prediction: str
    probability: float


@app.post("/predict")
def predict(request: ImageRequest):
    image = Image.open(io.BytesIO(base64.b64decode(request.image))).convert("RGB")
    x = transform(image).unsqueeze(0)
    with torch.no_grad():
        probabilities = torch.softmax(model(x), dim=1)
    index = int(probabilities.argmax(dim=1))
    return PredictionResponse(prediction=CLASSES[index], probability=float(probabilities[0, index]))
