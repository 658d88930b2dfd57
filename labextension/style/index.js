import './base.css';
import './history.css';
