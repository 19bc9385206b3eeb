// Preview the chosen image and refuse files over the size limit before
// uploading them. The form still works without JavaScript.
(function () {
  "use strict";
  var input = document.getElementById("file");
  var preview = document.getElementById("preview");
  var message = document.getElementById("client-error");
  var form = document.getElementById("upload-form");
  var button = document.getElementById("submit");
  var maxBytes = parseInt(input.dataset.maxBytes, 10) || 0;

  function tooLarge(file) {
    return maxBytes > 0 && file.size > maxBytes;
  }

  input.addEventListener("change", function () {
    var file = input.files && input.files[0];
    message.hidden = true;
    preview.hidden = true;
    if (!file) { return; }
    if (tooLarge(file)) {
      message.textContent = "This file is " + Math.round(file.size / 1048576) +
        " MiB; the limit is " + Math.floor(maxBytes / 1048576) + " MiB.";
      message.hidden = false;
      return;
    }
    preview.src = URL.createObjectURL(file);   // stays in the browser
    preview.hidden = false;
  });

  form.addEventListener("submit", function (event) {
    var file = input.files && input.files[0];
    if (file && tooLarge(file)) {
      event.preventDefault();
      return;
    }
    button.disabled = true;
    button.textContent = "Classifying…";
  });

  // Coming back with the browser's Back button: make the button usable again.
  window.addEventListener("pageshow", function () {
    button.disabled = false;
    button.textContent = "Classify";
  });
})();
